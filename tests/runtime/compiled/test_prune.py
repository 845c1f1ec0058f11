"""`inferfleet-runtime prune-engine`: removes one compiled engine directory, and nothing that is not one."""

from __future__ import annotations

from inferfleet_runtime.cli import main


def engine(root, key="0123456789abcdef", digest="00ff00ff00ff00ff"):
    path = root / key / digest
    (path / "graphs").mkdir(parents=True)
    (path / "manifest.json").write_text("{}")
    (path / "graphs" / "decode-b1.pt2").write_bytes(b"graph")
    return path


def test_removes_the_engine_and_its_key_directory_when_left_empty(tmp_path, capsys):
    path = engine(tmp_path)
    assert main(["prune-engine", "--dir", str(path)]) == 0
    assert not path.parent.exists() and tmp_path.exists()
    assert list(tmp_path.iterdir()) == []
    assert capsys.readouterr().out.startswith("removed: ")


def test_keeps_the_other_engines_of_the_key(tmp_path):
    path = engine(tmp_path)
    other = engine(tmp_path, digest="11ee11ee11ee11ee")
    assert main(["prune-engine", "--dir", str(path)]) == 0
    assert not path.exists() and (other / "manifest.json").is_file()


def test_an_engine_already_gone_is_success(tmp_path, capsys):
    assert main(["prune-engine", "--dir", str(tmp_path / "k" / "d")]) == 0
    assert capsys.readouterr().out.startswith("already gone: ")


def test_a_directory_that_is_no_engine_or_a_symlink_is_refused_and_kept(tmp_path, capsys):
    plain = tmp_path / "k" / "d"
    plain.mkdir(parents=True)
    (plain / "weights.bin").write_bytes(b"x")
    assert main(["prune-engine", "--dir", str(plain)]) == 2
    assert (plain / "weights.bin").is_file() and "not a compiled engine directory" in capsys.readouterr().err
    link = tmp_path / "link"
    link.symlink_to(engine(tmp_path, key="fedcba9876543210"))
    assert main(["prune-engine", "--dir", str(link)]) == 2
    assert (link / "manifest.json").is_file() and "is a symlink" in capsys.readouterr().err
