"""The files of fastdiff-accel's reference models, under ``DATA / NAME`` (read by ``fastdiff.zoo.shipped``)."""

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
