"""A real S3-compatible server for the tests: moto's server mode on loopback, in a thread (test helper).

`start()` returns the endpoint URL; `require_auth()` turns on moto's IAM checks, after which only the
access keys made by `add_user` (with an allow-all S3 policy) or none at all are accepted.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import boto3
from moto import settings as moto_settings
from moto.server import ThreadedMotoServer

REGION = "eu-west-1"


@dataclass
class S3StandIn:
    endpoint: str = ""
    server: ThreadedMotoServer | None = field(default=None, repr=False)

    def start(self) -> str:
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.reset()
        return self.endpoint

    def reset(self) -> None:
        """Empties every bucket and user: moto keeps its state per process, not per server."""
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"), timeout=10)

    def stop(self) -> None:
        if self.server is not None:
            self.reset()
            self.server.stop()

    def client(self, service: str = "s3", key_id: str = "setup", secret: str = "setup"):
        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
        )

    def upload_dir(self, bucket: str, prefix: str, root: Path) -> dict[str, bytes]:
        """Makes `bucket` and puts every file under root at prefix/relative path; -> {relative path: bytes}."""
        s3 = self.client()
        s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
        files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
        for rel, data in files.items():
            s3.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=data)
        return files

    def add_user(self, name: str, actions: list[str]) -> tuple[str, str]:
        """An IAM user allowed `actions` on every S3 resource; -> (access key id, secret)."""
        iam = self.client("iam")
        iam.create_user(UserName=name)
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
        iam.put_user_policy(UserName=name, PolicyName="s3", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def require_auth(self, monkeypatch) -> None:
        # moto checks signatures and IAM policies once its no-auth allowance is used up; 0 = from now on.
        monkeypatch.setattr(moto_settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
