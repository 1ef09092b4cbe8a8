"""Step distillation: progressive (``progressive``), consistency / LCM (``consistency``), ``lcm-lora(path=DIR)``.

Example::

    from fastdiff.distill.consistency import consistency
    from fastdiff.distill.common import load_student
    from fastdiff.zoo import build

    teacher = build("tiny-ddpm", "/tmp/tiny-ddpm")
    consistency(teacher, "/tmp/lcm", train_steps=20)
    images = load_student("/tmp/lcm")(batch_size=2, output_type="np").images  # LCM, 4 steps
"""
