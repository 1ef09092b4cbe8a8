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


BUILD_COMMAND_FLOW_ONESTEP = "bash benchmarks/onestep_flow.sh ROOT, then ROOT/dmd/steps-1"
# the one-step DMD student of digits-flow at guidance 1.5 (benchmarks/results/onestep_flow_quality.json and
# onestep_flow_speed.json): its transformer and scheduler, used on digits-flow as student(path=DIR,steps=1)
SHIPPED_FLOW_ONESTEP: dict[str, tuple[int, str]] = {
    "model_index.json": (811, "e18c020378a4e6b1de36e96a1b9dc2316f323d0e282dbff4a39c8a792b4642d6"),
    "scheduler/scheduler_config.json": (
        482,
        "b551508c7fc8a1b675c87458fcb5ea64d2b1e3e8492e765f2db8c71f67c7b0c9",
    ),
    "transformer/config.json": (475, "08765fa6479f8d9cd1bc8735016853eb9cf2dc7c73ba54cc6cbb6cef173d1d54"),
    "transformer/diffusion_pytorch_model.safetensors": (
        13963208,
        "6ca34e13d7ed15c38230e23bc9e8a36c5da1f274f5318fab9bba9faf8ac7bf8b",
    ),
    "fastdiff_distill.json": (5119, "037bfe5c3d1f92cf896f3496c0c62257ffde9394a45d7078ea89f8e890221bd0"),
    "loss.csv": (17070, "808b10f58c2555c974933183f78a341f1127c042b8b2ace888de931a2f82edb1"),
}
