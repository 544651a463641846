"""The S3 gateway SIGKILLed in the middle of a PUT and of a multipart upload (driven by s3.rs).

Usage: killed.py before|after ENDPOINT ACCESS_KEY SECRET_KEY.
- before: puts `obj` (3 MiB, pattern A), starts a multipart upload of `multi` with part 1
  (5 MiB) done, then begins a PUT of `obj` (64 MiB announced) and a part 2 of `multi`, sends
  24 MiB of each (several chunks written to the cluster), prints "sent" with the upload id,
  and waits to be killed with the gateway.
- after (a new gateway over the same cluster): `obj` is still A, whole, with A's ETag, and
  nothing else is listed; the multipart upload still lists part 1 only, takes part 2 again
  and completes to the right bytes; a new PUT of `obj` replaces it. Prints "ok".
"""
import hashlib
import socket
import sys
import time
import urllib.parse

import boto3
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

phase, endpoint, access, secret = sys.argv[1:5]
MiB = 1 << 20
BUCKET = "killed"
s3 = boto3.client(
    "s3",
    endpoint_url=endpoint,
    aws_access_key_id=access,
    aws_secret_access_key=secret,
    region_name="us-east-1",
    config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
)


def pattern(tag, size):
    block = hashlib.sha256(tag.encode()).digest() * (MiB // 32)
    return (block * (size // len(block) + 1))[:size]


A = pattern("A", 3 * MiB)
B = pattern("B", 9 * MiB)
PART1 = pattern("part 1", 5 * MiB)
PART2 = pattern("part 2", 6 * MiB + 77)


def expect(got, want, what):
    if got != want:
        shown = (len(got), len(want)) if isinstance(got, bytes) else (got, want)
        raise AssertionError(f"{what}: got {shown[0]!r}, want {shown[1]!r}")


def begin_put(path, announced, sent):
    """A signed PUT (unsigned payload) of `announced` bytes of which only `sent` go out."""
    url = f"{endpoint}{path}"
    request = AWSRequest(method="PUT", url=url, data=b"")
    request.headers["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
    request.headers["Content-Length"] = str(announced)
    S3SigV4Auth(Credentials(access, secret), "s3", "us-east-1").add_auth(request)
    target = urllib.parse.urlsplit(url)
    conn = socket.create_connection((target.hostname, target.port))
    head = f"PUT {target.path}{'?' + target.query if target.query else ''} HTTP/1.1\r\n"
    head += f"Host: {target.netloc}\r\n"
    for name, value in request.headers.items():
        if name.lower() != "host":
            head += f"{name}: {value}\r\n"
    conn.sendall((head + "\r\n").encode())
    conn.sendall(pattern("torn", sent))
    return conn


def before():
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="obj", Body=A)
    upload = s3.create_multipart_upload(Bucket=BUCKET, Key="multi")["UploadId"]
    s3.upload_part(Bucket=BUCKET, Key="multi", UploadId=upload, PartNumber=1, Body=PART1)
    held = [begin_put(f"/{BUCKET}/obj", 64 * MiB, 24 * MiB)]
    query = urllib.parse.urlencode({"partNumber": 2, "uploadId": upload})
    held.append(begin_put(f"/{BUCKET}/multi?{query}", 64 * MiB, 24 * MiB))
    time.sleep(1)  # the gateway takes in what was sent
    print(f"sent {upload}", flush=True)
    time.sleep(600)


def after(upload):
    expect(s3.get_object(Bucket=BUCKET, Key="obj")["Body"].read(), A, "obj after the kill")
    head = s3.head_object(Bucket=BUCKET, Key="obj")
    expect(head["ETag"].strip('"'), hashlib.md5(A).hexdigest(), "obj's ETag after the kill")
    keys = [(o["Key"], o["Size"]) for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    expect(keys, [("obj", len(A))], "objects listed after the kill")
    parts = s3.list_parts(Bucket=BUCKET, Key="multi", UploadId=upload).get("Parts", [])
    expect([(p["PartNumber"], p["Size"]) for p in parts], [(1, len(PART1))], "parts after the kill")
    second = s3.upload_part(Bucket=BUCKET, Key="multi", UploadId=upload, PartNumber=2, Body=PART2)
    done = [{"PartNumber": 1, "ETag": parts[0]["ETag"]}, {"PartNumber": 2, "ETag": second["ETag"]}]
    s3.complete_multipart_upload(Bucket=BUCKET, Key="multi", UploadId=upload,
                                 MultipartUpload={"Parts": done})
    got = s3.get_object(Bucket=BUCKET, Key="multi")["Body"].read()
    expect(got, PART1 + PART2, "multi completed after the kill")
    s3.put_object(Bucket=BUCKET, Key="obj", Body=B)
    expect(s3.get_object(Bucket=BUCKET, Key="obj")["Body"].read(), B, "obj replaced after")
    print("ok", flush=True)


if phase == "before":
    before()
else:
    after(sys.argv[5])
