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
