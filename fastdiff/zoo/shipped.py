"""The reference models shipped with the package (digits, digits-sd, digits-flow, moving-digits, and digits' one-step
students digits-onestep, digits-onestep-g1 and digits-flow-onestep), checked by sha256 before every use.

``DATA_ROOT / "digits"`` (the fastdiff-accel-references distribution: ``pip install "fastdiff-accel[zoo]"``,
or ``references/`` in a clone) holds one build of ``fastdiff reference build DIR --steps 3000 --seed 0``
(the pipeline with its fp32 safetensors weights, the evaluation classifier, the train/test split, the build's
report and training log). ``install_digits`` copies it into a build directory in well under a second,
after checking every file's size and sha256 against the table below: a corrupted, truncated or missing file
raises ``ShippedModelError`` naming the file and the command that rebuilds the model, never wrong numbers.

Example::

    from fastdiff.zoo.shipped import install_digits
    from fastdiff import FastPipeline

    path = install_digits("/tmp/digits")            # what `fastdiff zoo build digits DIR --size bench` does
    fp = FastPipeline.from_pretrained(path, accelerators="scheduler(name=dpm++2m,steps=20)")
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from fastdiff.zoo.shipped_onestep import (
    BUILD_COMMAND_FLOW_ONESTEP,
    BUILD_COMMAND_ONESTEP,
    BUILD_COMMAND_ONESTEP_G1,
    SHIPPED_FLOW_ONESTEP,
    SHIPPED_ONESTEP,
    SHIPPED_ONESTEP_G1,
)

INSTALL_HINT = (
    'the reference models are a distribution of their own: pip install "fastdiff-accel[zoo]" (from a clone of '
    "the repository: pip install ./references)"
)


def _data_root() -> Path:
    """Where the reference models' files are: the fastdiff-accel-references distribution, else (a source tree
    run from its checkout) the repository's references/ folder."""
    try:
        import fastdiff_references
    except ImportError:
        return Path(__file__).resolve().parents[2] / "references" / "fastdiff_references" / "data"
    return fastdiff_references.DATA


DATA_ROOT = _data_root()
DATA_DIR = DATA_ROOT / "digits"
BUILD_COMMAND = "fastdiff reference build DIR --steps 3000 --seed 0"
REBUILD_HINT = (
    f"reinstall fastdiff-accel-references, or train the model yourself with `{BUILD_COMMAND}` (about 15-25 minutes on 2 CPU "
    "cores) and pass DIR as the model, or run `fastdiff demo --retrain`"
)

# relative path -> (size in bytes, sha256) of every shipped file; regenerate with `shipped_table(DATA_DIR)`
SHIPPED: dict[str, tuple[int, str]] = {
    "model_index.json": (193, "1e0f2d63cb39f732fd359962be4d64ebdd1b9092a6e861cca4460715aa256104"),
    "scheduler/scheduler_config.json": (
        498,
        "f0e546991502b755bf998b43b027a19a8419e0a95206f954b236e58d738817e8",
    ),
    "unet/config.json": (980, "c33fd7f87329f78112b6ee792eed92deb6f87641d7f0f3bb867c21c35197ddb7"),
    "unet/diffusion_pytorch_model.safetensors": (
        4679708,
        "b911b07afb19fa165ce2676e386deda7356960b56dd4cf627c91d28072e65dbf",
    ),
    "eval/classifier.pt": (803815, "4885c1ce0a300088b5993d71694f62bbed3b0cf19460c7ea9268c3e23998a36b"),
    "eval/split.npz": (1035231, "e20b0c4606835061e92d40eb0bc1cb826fd6a26099d8171216ab2e1c3ee8436f"),
    "eval/report.json": (511, "73280f103dcc815b0fec48c835e8988a3aff5df0b7493106594d843507223e65"),
    "train_log.jsonl": (15565, "3fb137fcfd204efd8ba23e24c360dee0deac8b7f4676de5b1fafe5d66d55318e"),
}


DATA_DIR_SD = DATA_DIR.parent / "digits-sd"
BUILD_COMMAND_SD = "fastdiff reference build DIR --kind sd --seed 0"
# digits-sd shares the digits reference's evaluation files (classifier, split): installed from DATA_DIR
SHIPPED_SD: dict[str, tuple[int, str]] = {
    "model_index.json": (557, "d34ebfa1831c9990a5ed7986d550296516da01394d6eb9a128d444557a84d513"),
    "scheduler/scheduler_config.json": (
        502,
        "28d1a009dfa466938be057413130d37105fb555c44c7c403af4cbdb4c3194f5c",
    ),
    "unet/config.json": (1708, "a374aacdc88d46b6f4bc37c13d10693306b8e1f4640c29cc9a4921d8325289a3"),
    "unet/diffusion_pytorch_model.safetensors": (
        5992776,
        "a4a7cd624909f82e62ceaf016fdb1ba8a5b7ad9077c52245203183d5f0231928",
    ),
    "vae/config.json": (653, "0a164b76721162c048b2e2ed0523767eb936225e8fab319d82d09285069d94a2"),
    "vae/diffusion_pytorch_model.safetensors": (
        2641916,
        "c79124d59f9c922b9b4040627d5c96fb6f3a81b252e54a371b003377201a90f0",
    ),
    "text_encoder/config.json": (539, "da97b632e1cafebbaf52c2d11b01e4c98a3578bfa879f0f67b1f3452836ede98"),
    "text_encoder/model.safetensors": (
        746776,
        "ac200c32cc1fce9aca41e829e3a467c916a8f2f5fbd79f9728b82d6d8c20a445",
    ),
    "tokenizer/tokenizer.json": (65850, "32c27a652ac7e76dba7184220e036810f7e1e75bd3e20446e6551adecade6883"),
    "tokenizer/tokenizer_config.json": (
        224,
        "6b58667b77fc658d9a6a7056ad703210b2c4071cf79f4c90002998072bbdfb4a",
    ),
    "eval/prompts.json": (805, "9777ca37671e43fe5b3996d67e4e9379328ca7233f28e62bf31a175cabe9da1d"),
    "eval/report.json": (770, "74f9fef68deb65cbc5c7a9342f910302203185d19fc1978ed5681959cfc89629"),
    "unet_loss.csv": (769071, "c1ff3d7d372ccf026ebdde4a5ab9886a556ee8390020ad6edaa41d19cc20d60e"),
    "vae_loss.csv": (17484, "504a753cb419b822c2c5ba6e1cb1fd5c483faaf356988807911cbe1fd675a59a"),
}


DATA_DIR_FLOW = DATA_DIR.parent / "digits-flow"
BUILD_COMMAND_FLOW = "python -m fastdiff.zoo.reference_flow build DIR --steps 18000 --threads 1"
# digits-flow (fastdiff/zoo/reference_flow.py), scored with the digits reference's classifier and split too
SHIPPED_FLOW: dict[str, tuple[int, str]] = {
    "model_index.json": (750, "d8d2901f749115a598b53c0d672e257f2bfcda8be7ec4e69bf42f9d35be83a91"),
    "scheduler/scheduler_config.json": (
        482,
        "b551508c7fc8a1b675c87458fcb5ea64d2b1e3e8492e765f2db8c71f67c7b0c9",
    ),
    "transformer/config.json": (406, "2bc7ca72bd871098c3f2e307afe569fdf006e25f1b0efbf13b01cf47a099fd1c"),
    "transformer/diffusion_pytorch_model.safetensors": (
        13963208,
        "31c2d87ce347d902938122da58900682d9a20ec48c140930155f426771b11eb4",
    ),
    "vae/config.json": (733, "459e49fede6fad2cd6357bc2f6940804e38d0c2cbecf352f04293ef2123d07f1"),
    "vae/diffusion_pytorch_model.safetensors": (
        2641916,
        "c79124d59f9c922b9b4040627d5c96fb6f3a81b252e54a371b003377201a90f0",
    ),
    "text_encoder/config.json": (553, "4810ff3e921d536a5f9260ebba005ea85e8c72a91af1df8b138a4949a8988a70"),
    "text_encoder/model.safetensors": (
        763648,
        "598b39de54ded63e8e6312e14146d9f684e1fd2c17aa42b010bda399c124129e",
    ),
    "text_encoder_2/config.json": (553, "4810ff3e921d536a5f9260ebba005ea85e8c72a91af1df8b138a4949a8988a70"),
    "text_encoder_2/model.safetensors": (
        763648,
        "598b39de54ded63e8e6312e14146d9f684e1fd2c17aa42b010bda399c124129e",
    ),
    "tokenizer/tokenizer.json": (65742, "a5d03d2f1c012dc203be2093b9d2a55335bf72c2316ab1f74d7f8d109cbcf37f"),
    "tokenizer/tokenizer_config.json": (
        463,
        "506d7688f0532bd2fb72d742c43b83c8cdc28378e7ab887c3947428e7ea2eb0a",
    ),
    "tokenizer_2/tokenizer.json": (65742, "a5d03d2f1c012dc203be2093b9d2a55335bf72c2316ab1f74d7f8d109cbcf37f"),
    "tokenizer_2/tokenizer_config.json": (
        463,
        "506d7688f0532bd2fb72d742c43b83c8cdc28378e7ab887c3947428e7ea2eb0a",
    ),
    "eval/prompts.json": (823, "894abcd2991fecb785fe368196775969e7f95f533d3e4f79ff6dae5386332caf"),
    "eval/report.json": (650, "726e450d9881cba60581cd79b836b631351d0350c40c7cc0fe1d828ebfd02b94"),
    "transformer_loss.csv": (648462, "aa10e093a395d74988cae4f40e01b3dabdd7fb231f2dc2d526d85e478e80be70"),
}


DATA_DIR_VIDEO = DATA_DIR.parent / "moving-digits"
BUILD_COMMAND_VIDEO = "python -m fastdiff.zoo.reference_video build DIR --threads 2"
# moving-digits (fastdiff/zoo/reference_video.py): its frames are scored with the digits reference's classifier
SHIPPED_VIDEO: dict[str, tuple[int, str]] = {
    "model_index.json": (491, "77d30c31d8ec1a2a3fc574ff6ef36697db9ed25eaeb363f3d75413bb48369869"),
    "scheduler/scheduler_config.json": (
        883,
        "19f08c4328fbf87ba031efa763e50803d3a592b34f2f758101591a01d462f5a4",
    ),
    "transformer/config.json": (478, "9847b64294a247f55efe2d28f0a1df75bf965f87057154e845e8ba9fc11ff16e"),
    "transformer/diffusion_pytorch_model.safetensors": (
        4886512,
        "bdd2cec79f08af868ab0ea7130243fc3ec266b8e2a781006c6258ef3ea463196",
    ),
    "vae/config.json": (871, "de17f6f2c1e91375f1ffea682ff54e007e8b2fdd25c37bacef578bcb3b87e338"),
    "vae/diffusion_pytorch_model.safetensors": (
        2539524,
        "502412cfbb3bf36bf7841f90f525da850422d8ee77f6283ccb94115d7519c4aa",
    ),
    "text_encoder/config.json": (759, "3b5baa4e9ef08e4d6d58d548f46660b090058dc34634c6eb1e6982beee35b100"),
    "text_encoder/model.safetensors": (
        515112,
        "6163eac4aa6a46d9f65c66158a5bc170531b96ddef1d3274a9eaa544cab7260e",
    ),
    "tokenizer/tokenizer.json": (36834, "332acaacf2486e6cfa6388e648ca6483a640e9bbb22e4f0d19004692ce75bf78"),
    "tokenizer/tokenizer_config.json": (
        212,
        "4fec3e1a8ec0235440fa3f7bad11cf46a5272109907847a30d9f01bc04805138",
    ),
    "eval/prompts.json": (2687, "7ee4a97387f4f0c36272c627ac00966f6aad0f2c2f6f15c8184d51bc944eba70"),
    "eval/report.json": (898, "80cd28c94be98ef6249ec99a89aa53b229ee719faac430c049067a3457313a43"),
    "transformer_loss.csv": (353235, "720ea5faa4decefad9bb9453a9f5daed3055c132d9a432af03cfa011b3440c70"),
    "vae_loss.csv": (42238, "c6cee49a42e376293165ddebbfd844673a2c9ce7072e2718cb38fafea2d620c7"),
}


DATA_DIR_ONESTEP = DATA_DIR.parent / "digits-onestep"
DATA_DIR_ONESTEP_G1 = DATA_DIR.parent / "digits-onestep-g1"
DATA_DIR_FLOW_ONESTEP = DATA_DIR.parent / "digits-flow-onestep"


def shipped_models() -> dict[str, tuple[Path, dict[str, tuple[int, str]], str]]:
    """name -> (data folder, its table, the command that rebuilds it)."""
    return {
        "digits": (DATA_DIR, SHIPPED, BUILD_COMMAND),
        "digits-sd": (DATA_DIR_SD, SHIPPED_SD, BUILD_COMMAND_SD),
        "digits-flow": (DATA_DIR_FLOW, SHIPPED_FLOW, BUILD_COMMAND_FLOW),
        "moving-digits": (DATA_DIR_VIDEO, SHIPPED_VIDEO, BUILD_COMMAND_VIDEO),
        "digits-onestep": (DATA_DIR_ONESTEP, SHIPPED_ONESTEP, BUILD_COMMAND_ONESTEP),
        "digits-onestep-g1": (DATA_DIR_ONESTEP_G1, SHIPPED_ONESTEP_G1, BUILD_COMMAND_ONESTEP_G1),
        "digits-flow-onestep": (DATA_DIR_FLOW_ONESTEP, SHIPPED_FLOW_ONESTEP, BUILD_COMMAND_FLOW_ONESTEP),
    }


class ShippedModelError(ValueError):
    """A shipped (or installed) reference file is missing, truncated or corrupt."""


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes.

    Example::

        file_sha256(DATA_DIR / "model_index.json")
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def shipped_table(directory: str | Path, model: str = "digits") -> dict[str, tuple[int, str]]:
    """(size, sha256) of every shipped file of ``model`` as found in ``directory``: the source of its table.

    Example::

        assert shipped_table(DATA_DIR) == SHIPPED
    """
    directory, table = Path(directory), _model(model)[1]
    return {name: ((directory / name).stat().st_size, file_sha256(directory / name)) for name in table}


def _model(model: str) -> tuple[Path, dict[str, tuple[int, str]], str]:
    models = shipped_models()
    if model not in models:
        raise ValueError(f"no shipped model {model!r}; shipped: {', '.join(models)}")
    return models[model]


def _hint(model: str) -> str:
    return (
        REBUILD_HINT
        if model == "digits"
        else (
            f"reinstall fastdiff-accel-references, or train the model yourself with `{_model(model)[2]}` and pass DIR as the model"
        )
    )


def check_file(path: Path, name: str, model: str = "digits") -> None:
    """Raise ``ShippedModelError`` unless ``path`` has the size and sha256 recorded for ``name`` of ``model``.

    Example::

        check_file(DATA_DIR / "eval" / "classifier.pt", "eval/classifier.pt")
    """
    size, sha = _model(model)[1][name]
    what = f"{model} reference file {path}"
    if not path.is_file():
        raise ShippedModelError(f"{what} is missing; {_hint(model)}")
    actual_size = path.stat().st_size
    if actual_size != size:
        raise ShippedModelError(
            f"{what} is truncated or corrupt ({actual_size} bytes, expected {size}); {_hint(model)}"
        )
    actual = file_sha256(path)
    if actual != sha:
        raise ShippedModelError(f"{what} is corrupt (sha256 {actual[:16]}..., expected {sha[:16]}...); {_hint(model)}")


def verify(directory: str | Path, model: str = "digits") -> Path:
    """Check every shipped file of ``model`` under ``directory`` (a data folder or an installed build).

    digits-sd's evaluation files are the digits reference's: an installed digits-sd build is checked for both.

    Example::

        verify(DATA_DIR_SD, "digits-sd")   # raises ShippedModelError on the first bad file
    """
    directory = Path(directory)
    for name in _model(model)[1]:
        check_file(directory / name, name, model)
    return directory


def verify_digits(directory: str | Path) -> Path:
    """``verify(directory, "digits")``.

    Example::

        verify_digits(DATA_DIR)
    """
    return verify(directory, "digits")


SD_EVAL_FILES = ("eval/classifier.pt", "eval/split.npz")  # digits-sd is scored like the digits reference
# models installed with SD_EVAL_FILES
SCORED_LIKE_DIGITS = (
    "digits-sd",
    "digits-flow",
    "moving-digits",
    "digits-onestep",
    "digits-onestep-g1",
    "digits-flow-onestep",
)


def is_installed(directory: str | Path, model: str = "digits") -> bool:
    """Whether ``directory`` holds exactly the shipped files (a stale or damaged copy gives False).

    Example::

        if not is_installed("/tmp/digits"):
            install_digits("/tmp/digits")
    """
    try:
        verify(directory, model)
        if model in SCORED_LIKE_DIGITS:
            for name in SD_EVAL_FILES:
                check_file(Path(directory) / name, name, "digits")
    except ShippedModelError:
        return False
    return True


def install(out_dir: str | Path, model: str = "digits", source: str | Path | None = None) -> Path:
    """Copy shipped ``model`` from ``source`` (default: its data folder) into ``out_dir``, checked before and
    after copying; digits-sd also gets the digits reference's classifier and split.

    Files of an earlier build in ``out_dir`` (a checkpoint, logs) are left alone; the shipped ones replace
    theirs atomically (temp file then ``os.replace``).

    Example::

        install("/tmp/digits-sd", "digits-sd")
    """
    data, table, _ = _model(model)
    source, out = Path(source or data), Path(out_dir)
    if not source.is_dir() and not DATA_ROOT.is_dir():
        raise ShippedModelError(f"{model}: {INSTALL_HINT}")
    if not table:
        raise ShippedModelError(f"this fastdiff has no shipped {model} model; {_hint(model)}")
    verify(source, model)
    copies = [(source / name, name, model) for name in table]
    if model in SCORED_LIKE_DIGITS:
        verify_digits(DATA_DIR)
        copies += [(DATA_DIR / name, name, "digits") for name in SD_EVAL_FILES]
    for origin, name, owner in copies:
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        shutil.copyfile(origin, tmp)
        os.replace(tmp, target)
        check_file(target, name, owner)
    return out


def install_or_train(model: str, out_dir, size: str, seed: int, retrain: bool, sizes: dict, train) -> None:
    """A zoo builder's body: ``bench`` at seed 0 installs the shipped ``model`` (hash-checked) unless ``retrain``;
    any other size or seed calls ``train(out_dir, seed=seed, **sizes[size])``.

    Example::

        install_or_train("digits-flow", "/tmp/digits-flow", "test", 0, False, SIZES, build_reference_flow)
    """
    if size not in sizes:
        raise ValueError(f"{model} has no size {size!r}; allowed: {', '.join(sizes)}")
    if size == "bench" and seed == 0 and not retrain and shipped_models().get(model, (0, {}))[1]:
        install(out_dir, model)
        return
    train(out_dir, seed=seed, **sizes[size])


def install_digits(out_dir: str | Path, source: str | Path = DATA_DIR) -> Path:
    """``install(out_dir, "digits", source)``: the shipped digits reference, in well under a second.

    Example::

        install_digits("/tmp/digits")
    """
    return install(out_dir, "digits", source)


def ensure_digits(directory: str | Path) -> Path:
    """A digits build at ``directory``: one already there is kept (it may be your own retrained build);
    otherwise the shipped model is installed there (hash-checked). For scripts with a default model path.

    Example::

        model = ensure_digits(".fastdiff-cache/digits")
    """
    directory = Path(directory)
    if (directory / "model_index.json").is_file():
        return directory
    print(f"installing the shipped digits reference model (sha256-checked) into {directory}")
    return install_digits(directory)


__all__ = [
    "DATA_DIR",
    "DATA_DIR_SD",
    "DATA_DIR_FLOW",
    "DATA_DIR_VIDEO",
    "DATA_DIR_ONESTEP",
    "BUILD_COMMAND",
    "BUILD_COMMAND_SD",
    "BUILD_COMMAND_FLOW",
    "BUILD_COMMAND_VIDEO",
    "BUILD_COMMAND_ONESTEP",
    "SHIPPED",
    "SHIPPED_SD",
    "SHIPPED_FLOW",
    "SHIPPED_VIDEO",
    "SHIPPED_ONESTEP",
    "DATA_DIR_ONESTEP_G1",
    "BUILD_COMMAND_ONESTEP_G1",
    "SHIPPED_ONESTEP_G1",
    "ShippedModelError",
    "shipped_models",
    "file_sha256",
    "shipped_table",
    "check_file",
    "verify",
    "verify_digits",
    "is_installed",
    "install",
    "install_or_train",
    "install_digits",
    "ensure_digits",
]
