"""The shipped one-step students' file tables (size, sha256) and the commands that rebuild them (data only;
``fastdiff.zoo.shipped`` checks installs against them, ``fastdiff.zoo.onestep`` registers the builds)."""

from __future__ import annotations

BUILD_COMMAND_ONESTEP = "bash benchmarks/onestep_digits.sh ROOT 2, then ROOT/dmd-g2/steps-1"
# the one-step DMD student of the digits reference at guidance 2 (fastdiff/zoo/onestep.py; measured in
# benchmarks/results/onestep_g2.json), used on the digits teacher as student(path=DIR,steps=1)
SHIPPED_ONESTEP: dict[str, tuple[int, str]] = {
    "model_index.json": (244, "0c49813e7280a56b1d3229b950f7248fabf8cf1d7aa177177c90409e3a0a0f4e"),
    "scheduler/scheduler_config.json": (
        498,
        "e9430974067d75efebc66ca23b0d2cb5c90e35048f3db53fdb743c96484071d1",
    ),
    "unet/config.json": (1047, "042a243dd1fa993fb6009b1277fa4ea06a520fc079f8871baa0b01f5bc612d21"),
    "unet/diffusion_pytorch_model.safetensors": (
        4679708,
        "e26a28b16bae75250a047848ec93416c563b2360e00cf4cec8c232f1e57edca1",
    ),
    "fastdiff_distill.json": (7406, "d9da51f0170a0ceabd65eb9d79711600793220eba58a55865c074af20845d695"),
    "loss.csv": (34214, "b05cee743364f6432028b6d2637d0b0b9cfc5877e2c3ea713b63e00849d510ed"),
}


BUILD_COMMAND_ONESTEP_G1 = (
    'VARIANT=reg-hi VARIANT_ARGS="--regression 0.5 --ema-decay 0.99 --lr 2e-5 --fake-lr 4e-5" DMD_STEPS=1250 '
    "bash benchmarks/onestep_digits.sh ROOT 1, then ROOT/dmd-reg-hi-g1/steps-1"
)
# its one-step DMD student at guidance 1 (benchmarks/results/onestep_g1_reg-hi.json)
SHIPPED_ONESTEP_G1: dict[str, tuple[int, str]] = {
    "model_index.json": (244, "0c49813e7280a56b1d3229b950f7248fabf8cf1d7aa177177c90409e3a0a0f4e"),
    "scheduler/scheduler_config.json": (
        498,
        "e9430974067d75efebc66ca23b0d2cb5c90e35048f3db53fdb743c96484071d1",
    ),
    "unet/config.json": (1047, "3abab75888bbfb873e619dc211cd0e7c584d66ae35157e14064bea0fc2959adc"),
    "unet/diffusion_pytorch_model.safetensors": (
        4679708,
        "37c723620f92baa2663c5f07bc5ff2a5ce80d3012c56b744eb3b1571924d81ed",
    ),
    "fastdiff_distill.json": (7961, "e7d6b7e44020d43fc90ca65444ca8d7698448e72f71965afdeb2aded57a7e350"),
    "loss.csv": (36559, "fab3ef5a8bc026cf12a7274f86926cf5a011a9b7b438feb5d2447e069fe906a3"),
}


BUILD_COMMAND_FLOW_ONESTEP = (
    "the progressive start ROOT/progressive of bash benchmarks/onestep_flow.sh ROOT, then fastdiff distill dmd "
    "ROOT/digits-flow ROOT/dmd-gan-prompts --init ROOT/progressive/steps-1 --guidance 1.5 --train-steps 600 --batch 16 "
    "--fake-updates 2 --lr 2e-5 --fake-lr 4e-5 --regression 0 --ema-decay 0.99 --gan 3e-3 --gan-d 1e-2 --gan-lr 1e-3 "
    "--gan-prompts --save-every 50 --snapshot-every 100 --selection-seeds 0 --report-seeds 1, then "
    "ROOT/dmd-gan-prompts/steps-1"
)
# the one-step DMD student of digits-flow at guidance 1.5, its GAN head reading the prompts (measured in
# benchmarks/results/onestep_flow_quality_gan-prompts.json and onestep_flow_speed_gan-prompts.json): its transformer
# and scheduler, used on digits-flow as student(path=DIR,steps=1)
SHIPPED_FLOW_ONESTEP: dict[str, tuple[int, str]] = {
    "model_index.json": (800, "2238408f2f878e9fd210df93cd7417446ffb2d9ee22ef23c7f06bf7c15cef912"),
    "scheduler/scheduler_config.json": (
        482,
        "b551508c7fc8a1b675c87458fcb5ea64d2b1e3e8492e765f2db8c71f67c7b0c9",
    ),
    "transformer/config.json": (464, "844ed602fe145ee055a7dde20f242a0f5303e92a0488ec682e1d7bc999e32cbe"),
    "transformer/diffusion_pytorch_model.safetensors": (
        13963208,
        "596d6a4e617adb480fc2fc5f849542fd5adaba5c05def13fb0dfe305e61642d4",
    ),
    "fastdiff_distill.json": (5127, "cc5cef22107e021c676dc49635c464abcb95776d5dcbd7e6fe347ff96228d355"),
    "loss.csv": (16933, "1499316f08c4e9d9d9a1433772cbeae740ff15e1c1431ccd4c8d27647bfee26d"),
}
