"""Drives a Tessera S3 gateway with boto3: every operation the gateway claims, every byte checked.

Usage: client.py ENDPOINT ACCESS_KEY SECRET_KEY SEED. Exits non-zero with one line per failure.
"""
import hashlib
import random
import sys
import urllib.error
import urllib.request

import boto3
import botocore
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

endpoint, access, secret, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rng = random.Random(seed)
MiB = 1 << 20


def client(access_key=access, secret_key=secret, **extra):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, **extra),
    )


s3 = client()


def error_code(call, *args, **kwargs):
    """The S3 error code a call fails with (and its HTTP status), or fail if it succeeds."""
    try:
        call(*args, **kwargs)
    except botocore.exceptions.ClientError as e:
        return e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"]
    raise AssertionError(f"{call.__name__}{args} {kwargs} succeeded; an error was expected")


def expect(got, want, what):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def get_bytes(bucket, key, range_header=None):
    kwargs = {"Range": range_header} if range_header else {}
    return s3.get_object(Bucket=bucket, Key=key, **kwargs)["Body"].read()


# Buckets.
s3.create_bucket(Bucket="photos")
s3.create_bucket(Bucket="empty-one")
expect(error_code(s3.create_bucket, Bucket="photos")[0], "BucketAlreadyOwnedByYou", "create twice")
names = sorted(b["Name"] for b in s3.list_buckets()["Buckets"])
expect(names, ["empty-one", "photos"], "list buckets")
s3.head_bucket(Bucket="photos")
expect(error_code(s3.head_bucket, Bucket="nothere")[1], 404, "head of a missing bucket")
expect(error_code(s3.create_bucket, Bucket="Bad_Name")[0], "InvalidBucketName", "bad bucket name")

# A few-MiB object, not a multiple of any stripe, and the ranges of it.
big = rng.randbytes(5 * MiB + 12345)
put = s3.put_object(Bucket="photos", Key="2024/big.bin", Body=big, ContentType="application/x-test",
                    Metadata={"owner": "ada"})
expect(put["ETag"].strip('"'), hashlib.md5(big).hexdigest(), "ETag of the put")
got = get_bytes("photos", "2024/big.bin")
expect(len(got), len(big), "length of the whole get")
if got != big:
    raise AssertionError("whole get: bytes differ")
head = s3.head_object(Bucket="photos", Key="2024/big.bin")
expect(head["ContentLength"], len(big), "head length")
expect(head["ETag"].strip('"'), hashlib.md5(big).hexdigest(), "head ETag")
expect(head["Metadata"], {"owner": "ada"}, "user metadata")
expect(head["ContentType"], "application/x-test", "content type")
ranges = [(0, 0), (0, 65535), (65536, 65536 * 3 + 7), (len(big) - 1, len(big) - 1)]
ranges += [tuple(sorted(rng.randrange(len(big)) for _ in range(2))) for _ in range(8)]
for start, end in ranges:
    part = s3.get_object(Bucket="photos", Key="2024/big.bin", Range=f"bytes={start}-{end}")
    expect(part["ContentRange"], f"bytes {start}-{end}/{len(big)}", "content range")
    if part["Body"].read() != big[start:end + 1]:
        raise AssertionError(f"range {start}-{end}: bytes differ")
if get_bytes("photos", "2024/big.bin", "bytes=-1000") != big[-1000:]:
    raise AssertionError("suffix range: bytes differ")
if get_bytes("photos", "2024/big.bin", f"bytes={len(big) - 10}-") != big[-10:]:
    raise AssertionError("open range: bytes differ")
expect(error_code(s3.get_object, Bucket="photos", Key="2024/big.bin",
                  Range=f"bytes={len(big)}-")[0], "InvalidRange", "range past the end")
# Ranges at the type's limits: an end far past the object is cut at its end; a start there
# is not satisfiable; numbers past what the gateway's parser takes (2^63 on) are refused as an
# argument. Never a crash, never wrapped bytes.
for end in [2**63 - 1, 10**11]:
    part = s3.get_object(Bucket="photos", Key="2024/big.bin", Range=f"bytes=100-{end}")
    expect(part["ContentRange"], f"bytes 100-{len(big) - 1}/{len(big)}", f"range 100-{end}")
    if part["Body"].read() != big[100:]:
        raise AssertionError(f"range 100-{end}: bytes differ")
expect(error_code(s3.get_object, Bucket="photos", Key="2024/big.bin",
                  Range=f"bytes={2**63 - 2}-")[0], "InvalidRange", "range from near 2^63")
for header in [f"bytes={2**64 - 1}-", f"bytes=0-{2**64 - 1}", f"bytes={2**64}-", "bytes=5-3"]:
    expect(error_code(s3.get_object, Bucket="photos", Key="2024/big.bin", Range=header)[0],
           "InvalidArgument", header)

# Overwrite: the new bytes, whole.
small = rng.randbytes(1000)
s3.put_object(Bucket="photos", Key="2024/big.bin", Body=small)
expect(get_bytes("photos", "2024/big.bin"), small, "overwritten object")
s3.put_object(Bucket="photos", Key="2024/big.bin", Body=big)

# An empty object, and one laid out by a header.
s3.put_object(Bucket="photos", Key="empty", Body=b"")
expect(get_bytes("photos", "empty"), b"", "empty object")
s3.put_object(Bucket="photos", Key="raid5/obj", Body=small,
              Metadata={"tessera-scheme": "raid5", "tessera-stripe-unit": "16K", "tessera-width": "3"})
expect(get_bytes("photos", "raid5/obj"), small, "raid5 object")

# Listings: v2 and v1, with prefix, delimiter and pages of 2.
keys = ["2024/big.bin", "empty", "raid5/obj"] + [f"list/{c}/{i}" for c in "ab" for i in range(3)] + ["list/top"]
for key in keys[3:]:
    s3.put_object(Bucket="photos", Key=key, Body=key.encode())
every = [o["Key"] for p in s3.get_paginator("list_objects_v2").paginate(Bucket="photos", PaginationConfig={"PageSize": 2})
         for o in p.get("Contents", [])]
expect(every, sorted(keys), "list v2, pages of 2")
pages = list(s3.get_paginator("list_objects_v2").paginate(Bucket="photos", Prefix="list/", Delimiter="/",
                                                         PaginationConfig={"PageSize": 2}))
objects = [o["Key"] for p in pages for o in p.get("Contents", [])]
prefixes = [c["Prefix"] for p in pages for c in p.get("CommonPrefixes", [])]
expect((objects, prefixes), (["list/top"], ["list/a/", "list/b/"]), "list v2, prefix and delimiter")
expect(len(pages), 2, "pages of the delimited list")
v1 = [o["Key"] for p in s3.get_paginator("list_objects").paginate(Bucket="photos", Prefix="list/a/",
                                                                  PaginationConfig={"PageSize": 2})
      for o in p.get("Contents", [])]
expect(v1, ["list/a/0", "list/a/1", "list/a/2"], "list v1, prefix, pages of 2")
pages = list(s3.get_paginator("list_objects").paginate(Bucket="photos", Delimiter="/",
                                                       PaginationConfig={"PageSize": 1}))
top = [o["Key"] for p in pages for o in p.get("Contents", [])] + \
      [c["Prefix"] for p in pages for c in p.get("CommonPrefixes", [])]
expect(sorted(top), ["2024/", "empty", "list/", "raid5/"], "list v1, delimiter, pages of 1")
listed = s3.list_objects_v2(Bucket="photos", Prefix="2024/")["Contents"][0]
expect((listed["Size"], listed["ETag"].strip('"')), (len(big), hashlib.md5(big).hexdigest()), "listed size, ETag")

# Bad input gets S3's error codes.
expect(error_code(s3.get_object, Bucket="nothere", Key="x")[0], "NoSuchBucket", "get from a missing bucket")
expect(error_code(s3.put_object, Bucket="nothere", Key="x", Body=b"1")[0], "NoSuchBucket", "put to a missing bucket")
expect(error_code(s3.list_objects_v2, Bucket="nothere")[0], "NoSuchBucket", "list a missing bucket")
expect(error_code(s3.get_object, Bucket="photos", Key="missing")[0], "NoSuchKey", "get a missing key")
expect(error_code(s3.head_object, Bucket="photos", Key="missing")[1], 404, "head a missing key")
for key in ["../escape", "a/../b", "a/./b", "nul\x00byte"]:
    expect(error_code(s3.put_object, Bucket="photos", Key=key, Body=b"1")[0], "InvalidArgument", f"key {key!r}")
# An object cannot also be a prefix of another (objects are files of a tree).
for key in ["empty/below", "list"]:
    expect(error_code(s3.put_object, Bucket="photos", Key=key, Body=b"1")[0], "InvalidArgument", f"key {key!r}")
expect(get_bytes("photos", "empty"), b"", "the object a refused key ran into")
# A refused upload whose body was never sent (Expect: 100-continue) closes its connection: kept
# open, the server took the first byte of the client's next request for that body and
# answered the request with a bare 400 (a flaky 'got 400' above, before the fix).
import socket
import urllib.parse
host, port = urllib.parse.urlsplit(endpoint).hostname, urllib.parse.urlsplit(endpoint).port
with socket.create_connection((host, port), timeout=10) as raw:
    raw.sendall(b"PUT /photos/unsigned HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
                b"Expect: 100-continue\r\n\r\n")
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = raw.recv(65536)
        if not chunk:
            break
        answer += chunk
    head = answer.split(b"\r\n\r\n")[0].lower()
    expect(head.split(b" ")[1], b"403", "unsigned upload refused")
    expect(b"connection: close" in head, True, "a refused upload's connection is closed")
expect(error_code(s3.put_object, Bucket="photos", Key="k" * 1025, Body=b"1")[0], "KeyTooLongError", "long key")
expect(error_code(s3.put_object, Bucket="photos", Key="bad-md5", Body=b"abc",
                  ContentMD5="AAAAAAAAAAAAAAAAAAAAAA==")[0], "BadDigest", "wrong Content-MD5")
expect(error_code(s3.head_object, Bucket="photos", Key="bad-md5")[1], 404, "object of a refused put")
expect(error_code(s3.put_object, Bucket="photos", Key="2024/big.bin", Body=b"x",
                  Metadata={"tessera-scheme": "raid9"})[0], "InvalidArgument", "unknown scheme header")
expect(error_code(s3.delete_bucket, Bucket="photos")[0], "BucketNotEmpty", "delete a bucket with objects")
expect(get_bytes("photos", "2024/big.bin"), big, "object after refused requests")

# Signatures: a wrong secret, an unknown key, no signature at all.
expect(error_code(client(secret_key="wrong" + secret[5:]).list_buckets)[0], "SignatureDoesNotMatch", "wrong secret")
expect(error_code(client(access_key="AKIANOTAKEY0000000000").list_buckets)[0], "InvalidAccessKeyId", "unknown key")
anonymous = client(signature_version=botocore.UNSIGNED)
expect(error_code(anonymous.get_object, Bucket="photos", Key="empty")[0], "AccessDenied", "unsigned get")
expect(error_code(anonymous.put_object, Bucket="photos", Key="anon", Body=b"1")[0], "AccessDenied", "unsigned put")


def raw(method, path, body):
    """A correctly signed request with a body boto3 would never send; its status and XML."""
    request = AWSRequest(method=method, url=f"{endpoint}{path}", data=body)
    request.headers["x-amz-content-sha256"] = hashlib.sha256(body).hexdigest()
    S3SigV4Auth(Credentials(access, secret), "s3", "us-east-1").add_auth(request)
    prepared = request.prepare()
    http = urllib.request.Request(prepared.url, data=body, method=method, headers=dict(prepared.headers))
    try:
        with urllib.request.urlopen(http) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


status, text = raw("PUT", "/xml-bucket", b"<CreateBucketConfiguration><LocationConstraint>")
if status != 400 or "<Code>MalformedXML</Code>" not in text:
    raise AssertionError(f"malformed XML: {status} {text}")
expect(error_code(s3.head_bucket, Bucket="xml-bucket")[1], 404, "bucket of the malformed request")

# Deletes.
for key in keys:
    s3.delete_object(Bucket="photos", Key=key)
s3.delete_object(Bucket="photos", Key="never-there")
expect(error_code(s3.get_object, Bucket="photos", Key="2024/big.bin")[0], "NoSuchKey", "get after delete")
expect(s3.list_objects_v2(Bucket="photos").get("Contents", []), [], "list after deletes")
s3.delete_bucket(Bucket="photos")
s3.delete_bucket(Bucket="empty-one")
expect(s3.list_buckets()["Buckets"], [], "buckets after deletes")
expect(error_code(s3.delete_bucket, Bucket="photos")[0], "NoSuchBucket", "delete a deleted bucket")
# Multipart uploads: parts straight into the striped file when they line up, copied when not.
s3.create_bucket(Bucket="multi")


def multipart(key, parts, order=None, complete=None):
    """Upload `parts` (a list of bytes) as parts 1..n in `order`, complete with `complete`
    (the part numbers, default all), check the object; the upload id."""
    upload = s3.create_multipart_upload(Bucket="multi", Key=key, ContentType="video/x-test",
                                        Metadata={"kind": "multi"})["UploadId"]
    etags = {}
    for n in order or range(1, len(parts) + 1):
        answer = s3.upload_part(Bucket="multi", Key=key, UploadId=upload, PartNumber=n, Body=parts[n - 1])
        etags[n] = answer["ETag"]
        expect(etags[n].strip('"'), hashlib.md5(parts[n - 1]).hexdigest(), f"{key}: ETag of part {n}")
    chosen = complete or sorted(etags)
    done = s3.complete_multipart_upload(Bucket="multi", Key=key, UploadId=upload, MultipartUpload={
        "Parts": [{"PartNumber": n, "ETag": etags[n]} for n in chosen]})
    want = hashlib.md5(b"".join(hashlib.md5(parts[n - 1]).digest() for n in chosen)).hexdigest()
    expect(done["ETag"].strip('"'), f"{want}-{len(chosen)}", f"{key}: multipart ETag")
    body = b"".join(parts[n - 1] for n in chosen)
    got = get_bytes("multi", key)
    expect(len(got), len(body), f"{key}: length")
    if got != body:
        raise AssertionError(f"{key}: bytes differ")
    head = s3.head_object(Bucket="multi", Key=key)
    expect((head["ETag"].strip('"'), head["Metadata"], head["ContentType"]),
           (f"{want}-{len(chosen)}", {"kind": "multi"}, "video/x-test"), f"{key}: head")
    return upload


five = 5 * MiB
p = [rng.randbytes(five) for _ in range(3)] + [rng.randbytes(12345)]
multipart("in-order", p)                               # in place, the last part copied in
multipart("last-first", p, order=[4, 3, 1, 2])         # the short part first: still in place
multipart("odd-sizes", [rng.randbytes(five + 1), p[1], p[3]])  # sizes differ: copied
multipart("with-gap", p, complete=[1, 2, 4])           # part 3 left out: copied
multipart("one-part", [b"tiny"])
# A part uploaded twice: the second wins.
upload = s3.create_multipart_upload(Bucket="multi", Key="again")["UploadId"]
first = s3.upload_part(Bucket="multi", Key="again", UploadId=upload, PartNumber=1, Body=p[0])["ETag"]
second = s3.upload_part(Bucket="multi", Key="again", UploadId=upload, PartNumber=1, Body=p[1])["ETag"]
last = s3.upload_part(Bucket="multi", Key="again", UploadId=upload, PartNumber=2, Body=b"end")["ETag"]
listed = s3.list_parts(Bucket="multi", Key="again", UploadId=upload)["Parts"]
expect([(x["PartNumber"], x["Size"], x["ETag"]) for x in listed], [(1, five, second), (2, 3, last)], "list parts")
expect(error_code(s3.complete_multipart_upload, Bucket="multi", Key="again", UploadId=upload,
                  MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": first}, {"PartNumber": 2, "ETag": last}]})[0],
       "InvalidPart", "completion with a replaced part's ETag")
expect(error_code(s3.complete_multipart_upload, Bucket="multi", Key="again", UploadId=upload,
                  MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": last}, {"PartNumber": 1, "ETag": second}]})[0],
       "InvalidPartOrder", "parts out of order")
s3.complete_multipart_upload(Bucket="multi", Key="again", UploadId=upload, MultipartUpload={
    "Parts": [{"PartNumber": 1, "ETag": second}, {"PartNumber": 2, "ETag": last}]})
expect(get_bytes("multi", "again"), p[1] + b"end", "a part uploaded twice")
# Bad parts and unknown uploads.
upload = s3.create_multipart_upload(Bucket="multi", Key="bad")["UploadId"]
for n in [0, 10001]:
    expect(error_code(s3.upload_part, Bucket="multi", Key="bad", UploadId=upload, PartNumber=n, Body=b"x")[0],
           "InvalidArgument", f"part number {n}")
small = [s3.upload_part(Bucket="multi", Key="bad", UploadId=upload, PartNumber=n, Body=b"small")["ETag"] for n in [1, 2]]
expect(error_code(s3.complete_multipart_upload, Bucket="multi", Key="bad", UploadId=upload,
                  MultipartUpload={"Parts": [{"PartNumber": n + 1, "ETag": e} for n, e in enumerate(small)]})[0],
       "EntityTooSmall", "a small part that is not the last")
expect(error_code(s3.upload_part, Bucket="multi", Key="bad", UploadId="f" * 32, PartNumber=1, Body=b"x")[0],
       "NoSuchUpload", "unknown upload id")
expect(error_code(s3.upload_part, Bucket="multi", Key="bad", UploadId="../../x", PartNumber=1, Body=b"x")[0],
       "NoSuchUpload", "made-up upload id")
expect(error_code(s3.upload_part, Bucket="multi", Key="other", UploadId=upload, PartNumber=1, Body=b"x")[0],
       "NoSuchUpload", "upload id of another key")
uploads = s3.list_multipart_uploads(Bucket="multi")["Uploads"]
expect([(u["Key"], u["UploadId"]) for u in uploads], [("bad", upload)], "open uploads")
s3.abort_multipart_upload(Bucket="multi", Key="bad", UploadId=upload)
expect(error_code(s3.list_parts, Bucket="multi", Key="bad", UploadId=upload)[0], "NoSuchUpload", "after abort")
expect(error_code(s3.head_object, Bucket="multi", Key="bad")[1], 404, "object of an aborted upload")
expect(s3.list_multipart_uploads(Bucket="multi").get("Uploads", []), [], "no open uploads")
# boto3's own transfer manager: parts of 5 MiB, four at once, and a ranged parallel download.
import io
from boto3.s3.transfer import TransferConfig
transfer = TransferConfig(multipart_threshold=five, multipart_chunksize=five, max_concurrency=4)
blob = rng.randbytes(4 * five + 777)
s3.upload_fileobj(io.BytesIO(blob), "multi", "managed", Config=transfer)
out = io.BytesIO()
s3.download_fileobj("multi", "managed", out, Config=transfer)
if out.getvalue() != blob:
    raise AssertionError("managed transfer: bytes differ")

# CopyObject: the bytes, the metadata copied or replaced, conditions on the source.
small_src = rng.randbytes(3 * MiB + 5)
s3.put_object(Bucket="multi", Key="source", Body=small_src, ContentType="text/x-src",
              Metadata={"from": "source"})
src_etag = hashlib.md5(small_src).hexdigest()
done = s3.copy_object(Bucket="multi", Key="copy", CopySource={"Bucket": "multi", "Key": "source"})
expect(done["CopyObjectResult"]["ETag"].strip('"'), src_etag, "ETag of a copy")
expect(get_bytes("multi", "copy"), small_src, "copied bytes")
head = s3.head_object(Bucket="multi", Key="copy")
expect((head["Metadata"], head["ContentType"]), ({"from": "source"}, "text/x-src"), "copied metadata")
s3.copy_object(Bucket="multi", Key="copy", CopySource="multi/source", MetadataDirective="REPLACE",
               Metadata={"new": "yes"})
expect(s3.head_object(Bucket="multi", Key="copy")["Metadata"], {"new": "yes"}, "replaced metadata")
s3.copy_object(Bucket="multi", Key="in-order", CopySource="multi/in-order", MetadataDirective="REPLACE",
               Metadata={"self": "copy"})
expect(s3.head_object(Bucket="multi", Key="in-order")["Metadata"], {"self": "copy"}, "copy onto itself")
expect(error_code(s3.copy_object, Bucket="multi", Key="source", CopySource="multi/source")[0],
       "InvalidRequest", "copy onto itself without new metadata")
expect(error_code(s3.copy_object, Bucket="multi", Key="c2", CopySource="multi/missing")[0], "NoSuchKey", "copy of nothing")
expect(error_code(s3.copy_object, Bucket="multi", Key="c2", CopySource="multi/source",
                  CopySourceIfMatch='"00000000000000000000000000000000"')[0], "PreconditionFailed", "copy-source If-Match")
s3.copy_object(Bucket="multi", Key="c2", CopySource="multi/source", CopySourceIfMatch=f'"{src_etag}"')

# Conditional reads and puts.
import datetime
past = datetime.datetime(2001, 1, 1, tzinfo=datetime.timezone.utc)
future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
expect(len(s3.get_object(Bucket="multi", Key="source", IfMatch=f'"{src_etag}"')["Body"].read()), len(small_src), "If-Match")
expect(error_code(s3.get_object, Bucket="multi", Key="source", IfMatch='"abc"')[1], 412, "If-Match differs")
expect(error_code(s3.get_object, Bucket="multi", Key="source", IfNoneMatch=f'"{src_etag}"')[1], 304, "If-None-Match")
expect(error_code(s3.head_object, Bucket="multi", Key="source", IfModifiedSince=future)[1], 304, "If-Modified-Since")
expect(error_code(s3.get_object, Bucket="multi", Key="source", IfUnmodifiedSince=past)[1], 412, "If-Unmodified-Since")
expect(s3.head_object(Bucket="multi", Key="source", IfModifiedSince=past)["ContentLength"], len(small_src), "modified since")

# Presigned URLs (boto3's default, signature version 2, and version 4): a GET and a PUT by
# plain HTTP; a URL with one character of its signature changed, or expired, is refused.
import re
import time


def refused(url, what):
    try:
        urllib.request.urlopen(url)
    except urllib.error.HTTPError as e:
        expect(e.code, 403, what)
        return
    raise AssertionError(f"{what}: served")


for version in [None, "s3v4"]:
    signer = client(**({"signature_version": version} if version else {}))
    url = signer.generate_presigned_url("get_object", Params={"Bucket": "multi", "Key": "source"}, ExpiresIn=300)
    with urllib.request.urlopen(url) as answer:
        expect(answer.read(), small_src, f"presigned GET ({version})")
    signature = re.search(r"Signature=([^&]+)", url)
    changed = signature.group(1)[:-1] + ("0" if signature.group(1)[-1] != "0" else "1")
    refused(url[:signature.start(1)] + changed + url[signature.end(1):], f"tampered presigned URL ({version})")
    url = signer.generate_presigned_url("put_object", Params={"Bucket": "multi", "Key": f"by-url-{version}"},
                                        ExpiresIn=300)
    # Content-Type as signed (none): urllib would otherwise add a form type to a request with data.
    put = urllib.request.Request(url, data=b"put by url", method="PUT", headers={"Content-Type": ""})
    with urllib.request.urlopen(put) as answer:
        expect(answer.status, 200, f"presigned PUT ({version})")
    expect(get_bytes("multi", f"by-url-{version}"), b"put by url", f"object of the presigned PUT ({version})")
url = client(signature_version="s3v4").generate_presigned_url(
    "get_object", Params={"Bucket": "multi", "Key": "source"}, ExpiresIn=1)
time.sleep(2.5)
refused(url, "expired presigned URL")

for page in s3.get_paginator("list_objects_v2").paginate(Bucket="multi"):
    for obj in page.get("Contents", []):
        s3.delete_object(Bucket="multi", Key=obj["Key"])
s3.delete_bucket(Bucket="multi")

# One object stays, for the test to read through the CLI: laid out by the headers, plain bytes.
s3.create_bucket(Bucket="kept")
s3.put_object(Bucket="kept", Key="raid5/obj", Body=b"kept by the gateway\n" * 1000,
              Metadata={"tessera-scheme": "raid5", "tessera-stripe-unit": "16K", "tessera-width": "3"})
print("ok: every check passed")
