"""What each family declares about a detected model's files (`Family.files`, the only thing
the offline tools know about a family): complete and true for every family's model, and the
tools' refusals that come from it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from export import synthetic_chatterbox as synth
from onnx_tts.bundle import MANIFEST, Bundle, write_manifest
from onnx_tts.errors import ModelError
from onnx_tts.families import FAMILIES, detect, family_of
from onnx_tts.families.files import ModelFiles
from onnx_tts.tools.convert import convert_bundle_inplace_kv
from onnx_tts.tools.quantize import WeightsSpec, quantize_model
from tests.conftest import codec_lm_dir


@pytest.fixture(scope="module")
def turbo(tmp_path_factory) -> Path:
    """A Turbo stand-in with the float graphs and the published q8 and q4 variants."""
    root = tmp_path_factory.mktemp("turbo")
    synth.export(synth.SyntheticConfig(variant="turbo", precisions=("fp32", "q8", "q4")), root)
    return root


def _declared(root: Path) -> tuple[str, ModelFiles]:
    detection = detect(root)
    files = family_of(detection).files
    assert files is not None
    return detection.family, files(detection)


def _on_disk(files: ModelFiles) -> set[str]:
    """Every file under the model's directories, as a path relative to the model."""
    found = set()
    for place, directory in files.directories.items():
        for path in directory.rglob("*"):
            if path.is_file():
                relative = path.relative_to(directory).as_posix()
                found.add(f"{place}/{relative}" if place else relative)
    return found


def test_every_family_declares_its_files():
    assert FAMILIES and all(family.files is not None for family in FAMILIES.values())


@pytest.mark.parametrize("model", ["codec-lm", "turbo", "moss"])
def test_the_declaration_is_every_graph_of_the_model(model, turbo, moss_models):
    """Every .onnx file of the model is declared once, every file a graph reads exists, each
    role has a float graph, and the step LM is declared; variants only where published."""
    root = {"codec-lm": codec_lm_dir(), "turbo": turbo, "moss": moss_models}[model]
    family, files = _declared(root)
    graphs = [g.path for g in files.graphs]
    assert len(graphs) == len(set(graphs))
    on_disk = _on_disk(files)
    assert {p for p in on_disk if p.endswith(".onnx")} == set(graphs)
    for graph in files.graphs:
        assert set(graph.files()) <= on_disk, graph
        assert files.source(graph.path).is_file()
    roles = {g.role for g in files.graphs}
    assert roles == {g.role for g in files.graphs if not g.variant}
    assert any(g.step_lm for g in files.graphs)
    if model == "turbo":
        assert {g.variant for g in files.graphs} == {"", "q8", "q4"}
        assert files.variant_chosen_by in roles and set(files.variant_suffixes) == {"int8", "int4"}
        assert all(g.sidecars and not g.data for g in files.graphs)
    if model == "moss":
        assert len(files.directories) == 2 and files.manifest is None
        shared = [g for g in files.graphs if g.data]
        assert len(shared) == len(files.graphs)  # every graph reads a data file of the metas
    if model == "codec-lm":
        assert files.manifest == MANIFEST and family == "codec-lm"


def test_quantize_refuses_a_model_without_its_float_graph(turbo, tmp_path):
    """Variants are never a source: without the float language model there is nothing to
    quantize, and nothing is written."""
    source = tmp_path / "q4-only"
    shutil.copytree(turbo, source)
    for name in ("language_model.onnx", "language_model.onnx_data"):
        (source / "onnx" / name).unlink()
    with pytest.raises(ModelError, match="no float language_model graph"):
        quantize_model(source, tmp_path / "out", WeightsSpec("int8"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q4-only"]


def test_converting_a_model_whose_lms_are_in_place_is_refused(tmp_path):
    """codec-lm's lm_concat converts; its converted copy has no Concat cache left."""
    converted = tmp_path / "converted"
    reports = convert_bundle_inplace_kv(codec_lm_dir(), converted, check=False)
    assert [r.destination.name for r in reports] == ["lm_concat.onnx"]
    with pytest.raises(ModelError, match="nothing to convert"):
        convert_bundle_inplace_kv(converted, tmp_path / "again", check=False)
    assert not (tmp_path / "again").exists()


def test_write_manifest_hashes_the_files_on_disk(tmp_path):
    """The manifest written after a tool changed files carries their new hashes (a reader then
    validates the bundle), and a file it names that is not there is refused."""
    bundle = tmp_path / "bundle"
    shutil.copytree(codec_lm_dir(), bundle)
    manifest = {k: v for k, v in Bundle.read(bundle).manifest.items() if k != "sha256"}
    (bundle / "tokenizer.json").write_text(json.dumps({"changed": True}))
    with pytest.raises(ModelError, match="does not match the sha256"):
        Bundle.read(bundle).validate(("graphs",))
    write_manifest(bundle, manifest)
    Bundle.read(bundle).validate(("graphs",))
    with pytest.raises(ModelError, match=r"missing\.onnx"):
        write_manifest(bundle, {**manifest, "extra": "missing.onnx"})
