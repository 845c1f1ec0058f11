"""s3://BUCKET/PREFIX for `fetch`: every object under the prefix into a local folder, resuming partial files.

A partial file (`NAME.part`) resumes only while the object is the one it began from: its ETag is kept beside it
(`NAME.part.etag`) and must equal the listing's, and every GET carries `If-Match` with it, so an object replaced
mid-download is fetched again from its first byte instead of being spliced onto the old one's bytes.

Credentials and endpoint come from the environment as boto3 reads them (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_ENDPOINT_URL for S3-compatible stores); AWS_REGION is
honoured as well as AWS_DEFAULT_REGION. In a pod they come from spec.model.credentialsSecret.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tqdm import tqdm

from inferfleet_runtime.fetch.common import CREDENTIALS_HINT, FetchError, target_path, verify_sizes

CHUNK_BYTES = 1 << 20
NUM_ATTEMPTS = 3  # per file, each resuming from what the previous one wrote

# S3 error codes a person must act on -> what to tell them.
_REFUSED = {
    "NoSuchBucket": "no such bucket",
    "AccessDenied": f"access denied: check the credentials in {CREDENTIALS_HINT} and their policy",
    "InvalidAccessKeyId": f"the access key AWS_ACCESS_KEY_ID is not known: check {CREDENTIALS_HINT}",
    "SignatureDoesNotMatch": f"AWS_SECRET_ACCESS_KEY does not match the access key: check {CREDENTIALS_HINT}",
    "ExpiredToken": f"AWS_SESSION_TOKEN has expired: renew it in {CREDENTIALS_HINT}",
}


def fetch_s3(path: str, to: Path, show_progress: bool) -> None:
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    bucket, _, prefix = path.partition("/")
    uri = f"s3://{bucket}/{prefix}"
    client = _client()
    try:
        listing = _list(client, bucket, prefix + "/")
        sizes = {rel: size for rel, (size, _) in listing.items()}
        if not sizes:
            raise FetchError(f"could not fetch {uri}: no objects under that prefix")
        dests = {rel: target_path(to, rel) for rel in sizes}  # every key checked before any byte is written
        with tqdm(
            total=sum(sizes.values()),
            unit="B",
            unit_scale=True,
            desc=f"Fetching {uri}",
            disable=not show_progress,
            file=sys.stderr,
        ) as bar:
            for rel, (size, etag) in listing.items():
                _download(client, bucket, f"{prefix}/{rel}", dests[rel], size, etag, bar)
    except NoCredentialsError as exc:
        raise FetchError(
            f"could not fetch {uri}: no AWS credentials: set AWS_ACCESS_KEY_ID and "
            f"AWS_SECRET_ACCESS_KEY in {CREDENTIALS_HINT}"
        ) from exc
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        reason = _REFUSED.get(code) or f"{code or 'error'}: {str(error.get('Message', '')).strip()}"
        raise FetchError(f"could not fetch {uri}: {reason}") from exc
    except (BotoCoreError, OSError) as exc:
        raise FetchError(f"could not fetch {uri}: {str(exc).strip().splitlines()[0]}") from exc
    verify_sizes(to, sizes)


def _client():
    import boto3
    from botocore.config import Config

    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
    return boto3.session.Session().client(
        "s3",
        region_name=region,
        endpoint_url=endpoint,
        config=Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=10, read_timeout=60),
    )


def _list(client, bucket: str, prefix: str) -> dict[str, tuple[int, str]]:
    """-> {path below the prefix: (size, ETag)}; zero-byte "folder" markers (keys ending in /) are skipped."""
    found: dict[str, tuple[int, str]] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            rel = item["Key"][len(prefix) :]
            if rel and not rel.endswith("/"):
                found[rel] = (item["Size"], str(item.get("ETag", "")))
    return dict(sorted(found.items()))


def _download(client, bucket: str, key: str, dest: Path, size: int, etag: str, bar: tqdm) -> None:
    """Writes `key` to dest via dest.part; a .part left by an interrupted run is continued with a Range GET when it
    was begun from the same ETag, else started over."""
    from botocore.exceptions import ClientError, ResponseStreamingError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    if dest.is_file() and dest.stat().st_size == size:  # finished by an earlier run
        bar.update(size)
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    began_from = part.with_name(part.name + ".etag")
    for attempt in range(NUM_ATTEMPTS):
        done = part.stat().st_size if part.is_file() else 0
        recorded = began_from.read_text() if began_from.is_file() else None
        if done > size or recorded != etag:  # the object changed since, or its bytes are of an unknown one
            done = 0
        if attempt == 0:
            bar.update(done)
        try:
            if done == 0:
                began_from.write_text(etag)
            if done < size:
                extra = {"Range": f"bytes={done}-"} if done else {}
                if etag:
                    extra["IfMatch"] = etag
                body = client.get_object(Bucket=bucket, Key=key, **extra)["Body"]
                with open(part, "ab" if done else "wb") as writer:
                    for chunk in body.iter_chunks(CHUNK_BYTES):
                        writer.write(chunk)
                        bar.update(len(chunk))
            else:
                part.touch()
            break
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("PreconditionFailed", "412"):
                raise
            # Replaced since it was listed: this object's bytes are not the listing's; a fresh run lists it anew.
            part.unlink(missing_ok=True)
            began_from.unlink(missing_ok=True)
            raise FetchError(f"s3://{bucket}/{key} changed while it was being fetched; run the fetch again") from exc
        except (ResponseStreamingError, BotoConnectionError):
            if attempt == NUM_ATTEMPTS - 1:
                raise
    os.replace(part, dest)
    began_from.unlink(missing_ok=True)
