"""`inferfleet-runtime fetch` from file:// and from hf:// against a local stand-in for the Hub (s3://: test_fetch_s3)."""

from __future__ import annotations

import argparse
import os
import shutil

import pytest

from inferfleet_runtime.fetch import common as fetch_common
from inferfleet_runtime.fetch import sources as fetch
from inferfleet_runtime.fetch.content_digest import SOURCE_NAME, read_commit

from ..support.hub_standin import COMMIT, HubStandIn

REPO = "inferfleet/demo"


def run_fetch(uri: str, to, revision: str | None = None) -> int:
    return fetch.run(argparse.Namespace(uri=uri, to=to, no_progress=True, revision=revision))


def model_files(root) -> dict[str, bytes]:
    # snapshot_download keeps its bookkeeping in .cache/huggingface/ inside the target; that is not the model.
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".cache" not in p.relative_to(root).parts and p.name != SOURCE_NAME
    }


@pytest.fixture
def hub(demo_model_dir, monkeypatch):
    stand_in = HubStandIn(REPO, demo_model_dir)
    monkeypatch.setenv("HF_ENDPOINT", stand_in.start())
    monkeypatch.setenv("HF_TOKEN", "hf_local_test_token")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    yield stand_in
    stand_in.stop()


def file_gets(hub: HubStandIn) -> list[str]:
    return [r.path.rsplit("/", 1)[-1] for r in hub.requests if r.method == "GET" and "/resolve/" in r.path]


@pytest.mark.parametrize(
    "uri",
    [
        "s3://bucket",
        "s3:///model",
        "hf://just-a-name",
        "hf://org/name@",
        "hf://a/b/c",
        "file://otherhost/models/x",
        "pvc://claim/models/x",
        "not a uri",
    ],
)
def test_bad_uri_exits_2_with_one_readable_line(uri, tmp_path, capsys):
    assert run_fetch(uri, tmp_path / "out") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("inferfleet-runtime fetch: error:") and repr(uri) in err


def test_uri_forms_parse_to_repo_and_revision():
    assert fetch.parse_uri("hf://meta-llama/Llama-3.2-1B@v1.0") == fetch.Source("hf", "meta-llama/Llama-3.2-1B", "v1.0")
    assert fetch.parse_uri("hf://org/name") == fetch.Source("hf", "org/name", None)
    assert fetch.parse_uri("file:///models/my%20model") == fetch.Source("file", "/models/my model")
    assert fetch.parse_uri("s3://models/llama/3b/") == fetch.Source("s3", "models/llama/3b")
    assert fetch.parse_uri("hf://org/name", revision="v1.0") == fetch.Source("hf", "org/name", "v1.0")
    assert fetch.parse_uri("hf://org/name@v1.0", revision="v1.0") == fetch.Source("hf", "org/name", "v1.0")


@pytest.mark.parametrize(
    "uri, revision, expected",
    [
        ("hf://org/name@v1", "v2", "'hf://org/name@v1' names revision 'v1' but --revision is 'v2'"),
        ("s3://bucket/model", "v1", "--revision 'v1' applies to hf:// only, not 's3://bucket/model'"),
        ("file:///models/x", "v1", "--revision 'v1' applies to hf:// only, not 'file:///models/x'"),
    ],
)
def test_revision_that_cannot_apply_exits_2_with_one_line(uri, revision, expected, tmp_path, capsys):
    assert run_fetch(uri, tmp_path / "out", revision=revision) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"inferfleet-runtime fetch: error: {expected}")


def test_revision_flag_selects_the_hub_revision(hub, tmp_path, capsys):
    assert run_fetch(f"hf://{REPO}", tmp_path / "a", revision=COMMIT) == 0
    assert model_files(tmp_path / "a") == hub.files()
    assert any(r.path == f"/api/models/{REPO}/revision/{COMMIT}" for r in hub.requests)
    assert run_fetch(f"hf://{REPO}", tmp_path / "b", revision="v9") == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"inferfleet-runtime fetch: error: could not fetch hf://{REPO}@v9: revision not found"
    )


def test_file_uri_copies_the_directory_and_keeps_complete_files_on_rerun(demo_model_dir, tmp_path):
    out = tmp_path / "out"
    assert run_fetch(f"file://{demo_model_dir}", out) == 0
    assert model_files(out) == model_files(demo_model_dir)
    weights = out / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    (out / "config.json").write_bytes(b"{")  # a truncated file from an interrupted copy is redone
    assert run_fetch(f"file://{demo_model_dir}", out) == 0
    assert weights.stat().st_mtime_ns == stamp
    assert model_files(out) == model_files(demo_model_dir)


def test_file_uri_to_a_missing_directory_fails_with_one_line(tmp_path, capsys):
    assert run_fetch(f"file://{tmp_path}/absent", tmp_path / "out") == 1
    err = capsys.readouterr().err.strip()
    assert err == f"inferfleet-runtime fetch: error: {tmp_path}/absent is not a directory"


def test_hf_uri_downloads_every_file_through_the_endpoint_with_the_token(hub, tmp_path):
    out = tmp_path / "out"
    assert run_fetch(f"hf://{REPO}@main", out) == 0
    assert model_files(out) == hub.files()
    assert read_commit(out) == COMMIT  # the commit main resolved to, which the compiled engine is addressed by
    assert sorted(file_gets(hub)) == sorted(hub.files())
    api_calls = [r for r in hub.requests if r.path.startswith(f"/api/models/{REPO}")]
    assert api_calls and all(r.headers.get("authorization") == "Bearer hf_local_test_token" for r in api_calls)


def test_hf_uri_at_a_commit_and_at_an_unknown_revision(hub, tmp_path, capsys):
    assert run_fetch(f"hf://{REPO}@{COMMIT}", tmp_path / "a") == 0
    assert model_files(tmp_path / "a") == hub.files()
    capsys.readouterr()
    assert run_fetch(f"hf://{REPO}@no-such-branch", tmp_path / "b") == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"inferfleet-runtime fetch: error: could not fetch hf://{REPO}@no-such-branch: revision not found"
    ]
    assert run_fetch("hf://inferfleet/absent", tmp_path / "c") == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "inferfleet-runtime fetch: error: could not fetch hf://inferfleet/absent@main: repository not found"
        " (or no access with this token)"
    ]


def test_hf_transfer_cut_mid_file_is_retried_to_the_exact_bytes(hub, tmp_path):
    hub.drop_after_bytes["model.safetensors"] = 100_000
    out = tmp_path / "out"
    assert run_fetch(f"hf://{REPO}", out) == 0
    assert file_gets(hub).count("model.safetensors") == 2
    assert model_files(out) == hub.files()


def test_hf_rerun_after_a_failure_fetches_only_what_is_missing(hub, tmp_path, capsys):
    hub.fail_gets["model.safetensors"] = 1
    out = tmp_path / "out"
    assert run_fetch(f"hf://{REPO}", out) == 1
    assert "could not fetch" in capsys.readouterr().err
    assert not (out / "model.safetensors").exists()
    done_before = set(model_files(out))
    assert done_before == set(hub.files()) - {"model.safetensors"}
    hub.requests.clear()
    assert run_fetch(f"hf://{REPO}", out) == 0
    assert file_gets(hub) == ["model.safetensors"]  # files finished by the first run are not downloaded again
    assert model_files(out) == hub.files()


def test_cli_dispatches_fetch(demo_model_dir, tmp_path):
    from inferfleet_runtime.cli import main

    assert main(["fetch", "--uri", f"file://{demo_model_dir}", "--to", str(tmp_path / "out"), "--no-progress"]) == 0
    assert (tmp_path / "out" / "model.safetensors").stat().st_size == os.path.getsize(
        demo_model_dir / "model.safetensors"
    )


def test_hf_rerun_repairs_a_file_whose_size_is_wrong(hub, tmp_path):
    out = tmp_path / "out"
    assert run_fetch(f"hf://{REPO}", out) == 0
    with open(out / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    hub.requests.clear()
    assert run_fetch(f"hf://{REPO}", out) == 0
    assert file_gets(hub) == ["model.safetensors"]
    assert model_files(out) == hub.files()


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json"])  # an LFS file (sha256), a git one (blob id)
def test_hf_rerun_repairs_a_file_whose_bytes_are_not_the_hubs(hub, tmp_path, name):
    out = tmp_path / "out"
    assert run_fetch(f"hf://{REPO}", out) == 0
    edited = bytearray((out / name).read_bytes())
    edited[len(edited) // 2] ^= 0xFF  # same size: only the checksum tells
    (out / name).write_bytes(bytes(edited))
    hub.requests.clear()
    assert run_fetch(f"hf://{REPO}", out) == 0
    assert file_gets(hub) == [name]
    assert model_files(out) == hub.files()


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_hf_file_the_hub_serves_unlike_its_checksum_fails_naming_it(hub, tmp_path, capsys, name):
    data = hub.files()[name]
    hub.served_bytes[name] = data[:-1] + bytes([data[-1] ^ 0xFF])  # corrupted in transit or storage
    assert run_fetch(f"hf://{REPO}", tmp_path / "out") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"inferfleet-runtime fetch: error: could not fetch hf://{REPO}@main: {name} does not match the hub's "
        "checksum after a second download (1 file(s) differ)"
    ]
    assert file_gets(hub).count(name) == 2


def test_hf_fetches_only_the_files_the_runtime_reads(demo_model_dir, tmp_path, monkeypatch):
    repo_dir = tmp_path / "repo"
    shutil.copytree(demo_model_dir, repo_dir)
    (repo_dir / "pytorch_model.bin").write_bytes(b"\0" * 1000)  # the same weights in formats never read
    (repo_dir / "original").mkdir()
    (repo_dir / "original" / "consolidated.00.pth").write_bytes(b"\0" * 1000)
    stand_in = HubStandIn(REPO, repo_dir)
    monkeypatch.setenv("HF_ENDPOINT", stand_in.start())
    try:
        out = tmp_path / "out"
        assert run_fetch(f"hf://{REPO}", out) == 0
    finally:
        stand_in.stop()
    assert set(model_files(out)) == {name for name in stand_in.files() if not name.endswith((".bin", ".pth"))}
    assert not any(name.endswith((".bin", ".pth")) for name in file_gets(stand_in))


def test_progress_bars_go_to_stderr(demo_model_dir, hub, tmp_path, capfd):
    fetch.fetch(f"file://{demo_model_dir}", tmp_path / "a", show_progress=True)
    captured = capfd.readouterr()
    assert f"Copying {demo_model_dir.name}" in captured.err and "100%" in captured.err and captured.out == ""
    fetch.fetch(f"hf://{REPO}", tmp_path / "b", show_progress=True)
    captured = capfd.readouterr()
    assert "Fetching 5 files" in captured.err and captured.out == ""


def test_a_failed_fetch_leaves_its_error_line_as_the_termination_message(tmp_path, monkeypatch):
    termination_log = tmp_path / "termination-log"
    termination_log.write_text("")  # the kubelet creates the file; outside a container it is absent
    monkeypatch.setenv("INFERFLEET_TERMINATION_LOG", str(termination_log))
    assert run_fetch(f"file://{tmp_path / 'missing'}", tmp_path / "out") == 1
    message = termination_log.read_text()
    assert message.startswith("inferfleet-runtime fetch: error:") and "missing" in message
    assert len(message.splitlines()) == 1


def test_flags_the_fetch_does_not_know_are_the_termination_message_too(tmp_path, monkeypatch):
    from inferfleet_runtime.cli import main

    termination_log = tmp_path / "termination-log"
    termination_log.write_text("")
    monkeypatch.setenv("INFERFLEET_TERMINATION_LOG", str(termination_log))
    with pytest.raises(SystemExit) as exit_info:
        main(["fetch", "--uri", "hf://org/m", "--to", str(tmp_path), "--no-such-flag", "x"])
    assert exit_info.value.code == 2
    assert termination_log.read_text() == "inferfleet-runtime fetch: error: unrecognized arguments: --no-such-flag x"


def test_gated_model_is_fetched_with_hf_token_and_the_token_is_never_printed(hub, tmp_path, capfd):
    hub.required_token = "hf_local_test_token"
    out = tmp_path / "out"
    assert run_fetch(f"hf://{REPO}", out) == 0
    assert model_files(out) == hub.files()
    refused = [r for r in hub.requests if "authorization" not in r.headers]
    assert refused == []
    captured = capfd.readouterr()
    assert "hf_local_test_token" not in captured.err + captured.out


def test_gated_model_without_hf_token_fails_naming_hf_token_and_the_secret(hub, tmp_path, capfd, monkeypatch):
    hub.required_token = "hf_local_test_token"
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no token saved by `hf auth login` either
    assert run_fetch(f"hf://{REPO}", tmp_path / "out") == 1
    [line] = capfd.readouterr().err.strip().splitlines()
    assert line == (
        f"inferfleet-runtime fetch: error: could not fetch hf://{REPO}@main: access refused (gated or"
        " private model) and HF_TOKEN is not set: put HF_TOKEN in the Secret named by"
        " spec.model.credentialsSecret"
    )
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_gated_model_with_a_wrong_token_fails_without_printing_it(hub, tmp_path, capfd, monkeypatch):
    hub.required_token = "hf_local_test_token"
    monkeypatch.setenv("HF_TOKEN", "hf_wrong_secret_value")
    assert run_fetch(f"hf://{REPO}", tmp_path / "out") == 1
    captured = capfd.readouterr()
    [line] = captured.err.strip().splitlines()
    assert line.endswith(
        "access refused with the token in HF_TOKEN (from the Secret named by"
        " spec.model.credentialsSecret): check it is valid and has access"
    )
    assert "hf_wrong_secret_value" not in captured.err + captured.out


@pytest.mark.parametrize("name", ["", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a\\..\\b", "a\0b"])
def test_file_names_that_would_land_outside_the_target_are_refused(tmp_path, name):
    with pytest.raises(fetch.FetchError, match="outside the target"):
        fetch_common.target_path(tmp_path, name)


def test_a_target_folder_that_is_a_symlink_out_of_the_target_is_refused(tmp_path):
    (tmp_path / "to").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "to" / "sub").symlink_to(tmp_path / "elsewhere")
    assert fetch_common.target_path(tmp_path / "to", "ok/config.json") == tmp_path / "to" / "ok" / "config.json"
    with pytest.raises(fetch.FetchError, match="leads outside the target"):
        fetch_common.target_path(tmp_path / "to", "sub/config.json")


def test_file_uri_refuses_a_symlink_out_of_the_model_folder_and_copies_one_inside(demo_model_dir, tmp_path):
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_bytes((demo_model_dir / "config.json").read_bytes())
    (src / "same.json").symlink_to(src / "config.json")  # inside: copied as a file
    fetch.fetch(f"file://{src}", tmp_path / "out", show_progress=False)
    assert (tmp_path / "out" / "same.json").read_bytes() == (src / "config.json").read_bytes()
    secret = tmp_path / "secret.txt"
    secret.write_text("node credentials")
    (src / "tokenizer.json").symlink_to(secret)
    with pytest.raises(fetch.FetchError, match="outside"):
        fetch.fetch(f"file://{src}", tmp_path / "out2", show_progress=False)
    assert not (tmp_path / "out2" / "tokenizer.json").exists()
