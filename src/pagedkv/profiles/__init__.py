"""Built-in operator profiles for the GPU presets and preset models, selected by name.

One ``pagedkv-profile`` file per GPU x model, ``<gpu>/<model>.json`` (lower case: for example
``a100-80gb/opt-13b``), derived from public measurements by ``derive.py``; each file's
``source`` names the repository, path and commit it read and what was derived how, and says
where no measurement exists (there the roofline's terms stand in). ``h100-80gb`` is another
name of ``h100-sxm`` (the H100-SXM preset, 80 GB).

``--profile NAME`` reads a built-in by name where no file of that name exists;
``--cost-model profiled`` without ``--profile`` picks the built-in of ``--gpu`` and ``--model``
(``builtin_for``) when there is one.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
ALIASES = {"h100-80gb": "h100-sxm"}
"""Other names of a built-in's GPU directory."""


def builtin_names() -> list[str]:
    """Every built-in profile's name, ``gpu/model``."""
    return sorted(f"{p.parent.name}/{p.stem}" for p in HERE.glob("*/*.json"))


def builtin_path(name: str) -> Path | None:
    """The file of built-in ``name`` (case-insensitive ``gpu/model``), None if none."""
    gpu, sep, model = str(name).lower().partition("/")
    if not sep or "/" in model or not gpu or not model:
        return None
    path = HERE / ALIASES.get(gpu, gpu) / f"{model}.json"
    return path if path.is_file() else None


def builtin_for(gpu: str, model: str) -> str | None:
    """The built-in profile's name for a GPU preset and a preset model, None if none."""
    name = f"{gpu}/{model}".lower()
    return name if builtin_path(name) is not None else None
