"""s3://BUCKET/PREFIX for `fetch`: every object under the prefix into a local folder, resuming partial files.

Credentials and endpoint come from the environment as boto3 reads them (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_ENDPOINT_URL for S3-compatible stores); AWS_REGION is
honoured as well as AWS_DEFAULT_REGION. In a pod they come from spec.model.credentialsSecret.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tqdm import tqdm

from .fetch_common import CREDENTIALS_HINT, FetchError, target_path, verify_sizes

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
        sizes = _list(client, bucket, prefix + "/")
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
            for rel, size in sizes.items():
                _download(client, bucket, f"{prefix}/{rel}", dests[rel], size, bar)
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


def _list(client, bucket: str, prefix: str) -> dict[str, int]:
    """-> {path below the prefix: size}; zero-byte "folder" markers (keys ending in /) are skipped."""
    sizes: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            rel = item["Key"][len(prefix) :]
            if rel and not rel.endswith("/"):
                sizes[rel] = item["Size"]
    return dict(sorted(sizes.items()))


def _download(client, bucket: str, key: str, dest: Path, size: int, bar: tqdm) -> None:
    """Writes `key` to dest via dest.part; a .part left by an interrupted run is continued with a Range GET."""
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import ResponseStreamingError

    if dest.is_file() and dest.stat().st_size == size:  # finished by an earlier run
        bar.update(size)
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    for attempt in range(NUM_ATTEMPTS):
        done = part.stat().st_size if part.is_file() else 0
        if done > size:  # the object changed since: start over
            done = 0
        if attempt == 0:
            bar.update(done)
        try:
            if done < size:
                extra = {"Range": f"bytes={done}-"} if done else {}
                body = client.get_object(Bucket=bucket, Key=key, **extra)["Body"]
                with open(part, "ab" if done else "wb") as writer:
                    for chunk in body.iter_chunks(CHUNK_BYTES):
                        writer.write(chunk)
                        bar.update(len(chunk))
            else:
                part.touch()
            break
        except (ResponseStreamingError, BotoConnectionError):
            if attempt == NUM_ATTEMPTS - 1:
                raise
    os.replace(part, dest)
