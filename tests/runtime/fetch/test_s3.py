"""`inferfleet-runtime fetch` from s3:// against a real S3-compatible server (moto) on loopback."""

from __future__ import annotations

import argparse

import pytest

from inferfleet_runtime.fetch import s3 as fetch_s3
from inferfleet_runtime.fetch import sources as fetch

from ..support.s3_standin import REGION, S3StandIn

BUCKET = "models"
PREFIX = "inferfleet/demo"


def run_fetch(uri: str, to) -> int:
    return fetch.run(argparse.Namespace(uri=uri, to=to, no_progress=True, revision=None))


def model_files(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def s3(monkeypatch):
    server = S3StandIn()
    endpoint = server.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "any")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "any-secret")
    for name in ("AWS_DEFAULT_REGION", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    yield server
    server.stop()


@pytest.fixture
def uploaded(s3, demo_model_dir) -> dict[str, bytes]:
    return s3.upload_dir(BUCKET, PREFIX, demo_model_dir)


@pytest.fixture
def get_ranges(monkeypatch) -> list[tuple[str, str | None]]:
    """(key, Range header) of every GetObject fetch sends, recorded through botocore's event hooks."""
    seen: list[tuple[str, str | None]] = []
    make_client = fetch_s3._client

    def recording_client():
        client = make_client()
        client.meta.events.register(
            "before-send.s3.GetObject",
            lambda request, **_: seen.append((request.url.rsplit("/", 1)[-1], request.headers.get("Range"))),
        )
        return client

    monkeypatch.setattr(fetch_s3, "_client", recording_client)
    return seen


def test_s3_prefix_is_fetched_file_for_file(uploaded, tmp_path, capfd):
    out = tmp_path / "out"
    fetch.fetch(f"s3://{BUCKET}/{PREFIX}", out, show_progress=True)
    assert model_files(out) == uploaded
    captured = capfd.readouterr()
    assert f"Fetching s3://{BUCKET}/{PREFIX}" in captured.err and "100%" in captured.err and captured.out == ""


def etag_of(s3, name: str) -> str:
    return s3.client().head_object(Bucket=BUCKET, Key=f"{PREFIX}/{name}")["ETag"]


def test_s3_rerun_keeps_complete_files_and_resumes_a_partial_one(s3, uploaded, tmp_path, get_ranges):
    out = tmp_path / "out"
    assert run_fetch(f"s3://{BUCKET}/{PREFIX}/", out) == 0
    assert sorted(k for k, _ in get_ranges) == sorted(uploaded)
    weights = out / "model.safetensors"
    half = len(uploaded["model.safetensors"]) // 2
    weights.rename(out / "model.safetensors.part")
    with open(out / "model.safetensors.part", "r+b") as f:
        f.truncate(half)  # as if the pod was killed mid-download, beside the ETag it began from
    (out / "model.safetensors.part.etag").write_text(etag_of(s3, "model.safetensors"))
    get_ranges.clear()
    assert run_fetch(f"s3://{BUCKET}/{PREFIX}", out) == 0
    assert get_ranges == [("model.safetensors", f"bytes={half}-".encode())]
    assert model_files(out) == uploaded


def test_s3_partial_file_of_an_object_replaced_since_is_fetched_again_whole(s3, uploaded, tmp_path, get_ranges):
    out = tmp_path / "out"
    assert run_fetch(f"s3://{BUCKET}/{PREFIX}", out) == 0
    old_etag = etag_of(s3, "model.safetensors")
    half = len(uploaded["model.safetensors"]) // 2
    (out / "model.safetensors").rename(out / "model.safetensors.part")
    with open(out / "model.safetensors.part", "r+b") as f:
        f.truncate(half)
    (out / "model.safetensors.part.etag").write_text(old_etag)
    replaced = bytes(reversed(uploaded["model.safetensors"]))  # same size, other bytes: a new upload
    s3.client().put_object(Bucket=BUCKET, Key=f"{PREFIX}/model.safetensors", Body=replaced)
    assert etag_of(s3, "model.safetensors") != old_etag
    get_ranges.clear()
    assert run_fetch(f"s3://{BUCKET}/{PREFIX}", out) == 0
    assert get_ranges == [("model.safetensors", None)]  # from the first byte, not spliced onto the old half
    assert (out / "model.safetensors").read_bytes() == replaced
    assert not (out / "model.safetensors.part.etag").exists()


def test_s3_object_replaced_between_listing_and_download_fails_clearly_and_keeps_no_part(
    s3, uploaded, tmp_path, monkeypatch, capsys
):
    listed = fetch_s3._list

    def list_then_replace(client, bucket, prefix):
        found = listed(client, bucket, prefix)
        s3.client().put_object(Bucket=BUCKET, Key=f"{PREFIX}/model.safetensors", Body=b"replaced")
        return found

    monkeypatch.setattr(fetch_s3, "_list", list_then_replace)
    out = tmp_path / "out"
    assert run_fetch(f"s3://{BUCKET}/{PREFIX}", out) == 1
    assert "model.safetensors changed while it was being fetched" in capsys.readouterr().err
    assert not (out / "model.safetensors.part").exists() and not (out / "model.safetensors").exists()


def test_s3_missing_bucket_and_empty_prefix_fail_with_one_line(uploaded, tmp_path, capsys):
    assert run_fetch(f"s3://absent/{PREFIX}", tmp_path / "a") == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"inferfleet-runtime fetch: error: could not fetch s3://absent/{PREFIX}: no such bucket"
    ]
    assert run_fetch(f"s3://{BUCKET}/no/such/prefix", tmp_path / "b") == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"inferfleet-runtime fetch: error: could not fetch s3://{BUCKET}/no/such/prefix: no objects under that prefix"
    ]


def test_s3_credentials_are_read_from_the_environment(s3, uploaded, tmp_path, capfd, monkeypatch):
    key_id, secret = s3.add_user("reader", ["s3:ListBucket", "s3:GetObject"])
    _, other_secret = s3.add_user("someone", ["s3:*"])
    s3.require_auth(monkeypatch)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    assert run_fetch(f"s3://{BUCKET}/{PREFIX}", tmp_path / "ok") == 0
    assert model_files(tmp_path / "ok") == uploaded

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", other_secret)
    assert run_fetch(f"s3://{BUCKET}/{PREFIX}", tmp_path / "bad-secret") == 1
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNKEY000000")
    assert run_fetch(f"s3://{BUCKET}/{PREFIX}", tmp_path / "unknown-key") == 1
    captured = capfd.readouterr()
    assert captured.err.strip().splitlines()[-2:] == [
        f"inferfleet-runtime fetch: error: could not fetch s3://{BUCKET}/{PREFIX}: AWS_SECRET_ACCESS_KEY does not"
        " match the access key: check the Secret named by spec.model.credentialsSecret",
        f"inferfleet-runtime fetch: error: could not fetch s3://{BUCKET}/{PREFIX}: the access key AWS_ACCESS_KEY_ID"
        " is not known: check the Secret named by spec.model.credentialsSecret",
    ]
    assert secret not in captured.err and other_secret not in captured.err


def test_s3_access_denied_by_policy_names_the_secret(s3, uploaded, tmp_path, capsys, monkeypatch):
    key_id, secret = s3.add_user("lister", ["s3:ListBucket"])
    s3.require_auth(monkeypatch)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    assert run_fetch(f"s3://{BUCKET}/{PREFIX}", tmp_path / "out") == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"inferfleet-runtime fetch: error: could not fetch s3://{BUCKET}/{PREFIX}: access denied: check the"
        " credentials in the Secret named by spec.model.credentialsSecret and their policy"
    ]


def test_s3_without_credentials_names_the_variables(uploaded, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata lookup off this machine
    assert run_fetch(f"s3://{BUCKET}/{PREFIX}", tmp_path / "out") == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"inferfleet-runtime fetch: error: could not fetch s3://{BUCKET}/{PREFIX}: no AWS credentials: set"
        " AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the Secret named by spec.model.credentialsSecret"
    ]


@pytest.mark.parametrize("key", ["../escape.bin", "sub/../../escape.bin", "a//b.bin", "./x.bin"])
def test_s3_keys_that_would_land_outside_the_target_are_refused_before_any_write(s3, uploaded, tmp_path, key):
    s3.client().put_object(Bucket=BUCKET, Key=f"{PREFIX}/{key}", Body=b"payload")
    out = tmp_path / "deep" / "out"
    with pytest.raises(fetch.FetchError, match="would be written outside the target"):
        fetch.fetch(f"s3://{BUCKET}/{PREFIX}", out, show_progress=False)
    assert not (tmp_path / "deep" / "escape.bin").exists() and not (tmp_path / "escape.bin").exists()
    assert model_files(out) == {}  # refused before any object was downloaded
