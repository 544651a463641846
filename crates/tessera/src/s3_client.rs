//! A minimal S3 client for benchmarks: path-style PUT and GET of whole objects and
//! CreateBucket, signed with AWS Signature V4 over an unsigned payload, one HTTP/1.1
//! connection per request. Enough to drive Tessera's gateway and a peer store (MinIO) alike
//! from one process, without an SDK; not a general client.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};
use http_body_util::{BodyExt, Full};
use sha2::{Digest, Sha256};
use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

const REGION: &str = "us-east-1";
const UNSIGNED: &str = "UNSIGNED-PAYLOAD";

/// An S3 endpoint and the key pair requests are signed with.
#[derive(Clone)]
pub struct S3Client {
    pub addr: SocketAddr,
    pub access: String,
    pub secret: String,
}

fn hmac(key: &[u8], data: &str) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `YYYYMMDDTHHMMSSZ` for `secs` since the epoch (days to a civil date: Howard Hinnant's
/// algorithm, proleptic Gregorian).
fn amz_date(secs: u64) -> String {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (rem / 3600, rem / 60 % 60, rem % 60);
    format!("{year:04}{month:02}{day:02}T{h:02}{m:02}{s:02}Z")
}

/// A path's segments percent-encoded as SigV4 wants (unreserved characters kept).
fn encode_path(path: &str) -> String {
    let mut out = String::new();
    for b in path.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

impl S3Client {
    /// The `Authorization` header of a request with no query, and its `x-amz-date`.
    fn sign(&self, method: &str, path: &str, now: u64) -> (String, String) {
        let date_time = amz_date(now);
        let date = &date_time[..8];
        let host = self.addr.to_string();
        let signed = "host;x-amz-content-sha256;x-amz-date";
        let canonical = format!(
            "{method}\n{path}\n\nhost:{host}\nx-amz-content-sha256:{UNSIGNED}\n\
             x-amz-date:{date_time}\n\n{signed}\n{UNSIGNED}"
        );
        let scope = format!("{date}/{REGION}/s3/aws4_request");
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{date_time}\n{scope}\n{}",
            hex(&Sha256::digest(canonical.as_bytes()))
        );
        let mut key = hmac(format!("AWS4{}", self.secret).as_bytes(), date);
        for part in [REGION, "s3", "aws4_request"] {
            key = hmac(&key, part);
        }
        let signature = hex(&hmac(&key, &to_sign));
        let authorization = format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
            self.access
        );
        (authorization, date_time)
    }

    /// Sends one request; the status and the answer's body, as it arrives. The
    /// connection is driven by a task (`Answer::driver`) that callers abort when done with
    /// the body; one left behind on an error ends by itself once the body is dropped (this
    /// call's request sender is gone by then, so the connection closes).
    async fn send(&self, method: &str, path: &str, body: Bytes) -> Result<Answer> {
        let path = encode_path(path);
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
        let (authorization, date) = self.sign(method, &path, now);
        let request = http::Request::builder()
            .method(method)
            .uri(&path)
            .header("host", self.addr.to_string())
            .header("x-amz-content-sha256", UNSIGNED)
            .header("x-amz-date", date)
            .header("authorization", authorization)
            .header("content-length", body.len())
            .body(Full::new(body))?;
        let stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .with_context(|| format!("cannot connect to {}", self.addr))?;
        stream.set_nodelay(true)?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
        let driver = tokio::spawn(connection);
        let response = sender.send_request(request).await?;
        Ok(Answer {
            status: response.status().as_u16(),
            body: response.into_body(),
            driver,
        })
    }

    /// Sends one request; the status and the whole body of the answer.
    async fn request(&self, method: &str, path: &str, body: Bytes) -> Result<(u16, Bytes)> {
        let answer = self.send(method, path, body).await?;
        let status = answer.status;
        let body = answer.body.collect().await?.to_bytes();
        answer.driver.abort();
        Ok((status, body))
    }

    /// Makes bucket `bucket` (one that exists already is fine).
    pub async fn create_bucket(&self, bucket: &str) -> Result<()> {
        let (status, body) = self
            .request("PUT", &format!("/{bucket}"), Bytes::new())
            .await?;
        let text = String::from_utf8_lossy(&body);
        if status != 200 && !text.contains("BucketAlreadyOwnedByYou") {
            bail!("CreateBucket {bucket} at {}: {status} {text}", self.addr);
        }
        Ok(())
    }

    /// Puts `body` as `bucket/key`.
    pub async fn put(&self, bucket: &str, key: &str, body: Bytes) -> Result<()> {
        let (status, answer) = self
            .request("PUT", &format!("/{bucket}/{key}"), body)
            .await?;
        if status != 200 {
            let text = String::from_utf8_lossy(&answer);
            bail!("PutObject {bucket}/{key} at {}: {status} {text}", self.addr);
        }
        Ok(())
    }

    /// Reads `bucket/key` and checks it is `expected`, each piece of the body against the
    /// bytes at its offset as it arrives: nothing is gathered (collecting a 1 GiB body
    /// copied it whole into a fresh buffer after its last byte, ~0.3 CPU-s per GiB of
    /// copying and page faults, serial, counted in every S3 read).
    pub async fn get_checked(&self, bucket: &str, key: &str, expected: &[u8]) -> Result<()> {
        let mut answer = self
            .send("GET", &format!("/{bucket}/{key}"), Bytes::new())
            .await?;
        if answer.status != 200 {
            let status = answer.status;
            let body = answer.body.collect().await?.to_bytes();
            let text = String::from_utf8_lossy(&body);
            bail!("GetObject {bucket}/{key} at {}: {status} {text}", self.addr);
        }
        let mut at = 0usize;
        while let Some(frame) = answer.body.frame().await {
            let Ok(data) = frame?.into_data() else {
                continue;
            };
            let end = at + data.len();
            if expected.get(at..end) != Some(&data[..]) {
                bail!("GetObject {bucket}/{key}: the body differs within bytes {at}..{end}");
            }
            at = end;
        }
        answer.driver.abort();
        if at != expected.len() {
            bail!(
                "GetObject {bucket}/{key}: {at} bytes where {} were expected",
                expected.len()
            );
        }
        Ok(())
    }

    /// Removes `bucket/key`.
    pub async fn delete(&self, bucket: &str, key: &str) -> Result<()> {
        let (status, body) = self
            .request("DELETE", &format!("/{bucket}/{key}"), Bytes::new())
            .await?;
        if status != 204 && status != 200 {
            let text = String::from_utf8_lossy(&body);
            bail!(
                "DeleteObject {bucket}/{key} at {}: {status} {text}",
                self.addr
            );
        }
        Ok(())
    }
}

/// An answer whose body is still arriving, and the task driving its connection.
struct Answer {
    status: u16,
    body: hyper::body::Incoming,
    driver: tokio::task::JoinHandle<Result<(), hyper::Error>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(amz_date(0), "19700101T000000Z");
        // 2013-05-24T00:00:00Z, the date of AWS's SigV4 examples.
        assert_eq!(amz_date(1_369_353_600), "20130524T000000Z");
        assert_eq!(amz_date(951_782_400 + 3_661), "20000229T010101Z");
    }

    /// AWS's documented example (GET /test.txt, unsigned headers aside): the signing key
    /// derivation and HMAC chain must give its published signing key.
    #[test]
    fn signing_key_matches_aws_example() {
        let secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
        let mut key = hmac(format!("AWS4{secret}").as_bytes(), "20120215");
        for part in ["us-east-1", "iam", "aws4_request"] {
            key = hmac(&key, part);
        }
        assert_eq!(
            hex(&key),
            "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"
        );
    }

    #[test]
    fn paths_are_percent_encoded() {
        assert_eq!(encode_path("/b/a b+c"), "/b/a%20b%2Bc");
        assert_eq!(encode_path("/b/x-y_z.~"), "/b/x-y_z.~");
    }

    /// Serves one GET with `body`, written in pieces of 1,000 bytes (a body arrives in
    /// many frames), on a fresh local port.
    async fn serve_once(body: Vec<u8>) -> SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            while !head.ends_with(b"\r\n\r\n") {
                let mut byte = [0u8];
                stream.read_exact(&mut byte).await.unwrap();
                head.push(byte[0]);
            }
            let status = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
            stream.write_all(status.as_bytes()).await.unwrap();
            for piece in body.chunks(1_000) {
                stream.write_all(piece).await.unwrap();
                stream.flush().await.unwrap();
            }
        });
        addr
    }

    /// Whether `error` says the body differs within a range of bytes holding `at` (pieces
    /// may arrive joined: the range is the piece's, whatever its size).
    fn names_a_range_holding(error: &str, at: usize) -> bool {
        let Some((_, range)) = error.split_once("differs within bytes ") else {
            return false;
        };
        let (start, end) = range.split_once("..").expect("a range");
        (start.parse::<usize>().unwrap()..end.parse::<usize>().unwrap()).contains(&at)
    }

    /// A body is accepted only if every byte is the expected one at its offset and none is
    /// missing or extra.
    #[tokio::test]
    async fn a_get_is_checked_byte_for_byte_as_it_arrives() {
        let body: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let client = |addr| S3Client {
            addr,
            access: "a".into(),
            secret: "s".into(),
        };
        let same = client(serve_once(body.clone()).await);
        same.get_checked("b", "k", &body).await.unwrap();

        let mut changed = body.clone();
        changed[70_123] ^= 1;
        let differs = client(serve_once(body.clone()).await);
        let e = differs.get_checked("b", "k", &changed).await.unwrap_err();
        assert!(names_a_range_holding(&e.to_string(), 70_123), "{e}");

        let mut longer = body.clone();
        longer.push(0);
        let short = client(serve_once(body.clone()).await);
        let e = short.get_checked("b", "k", &longer).await.unwrap_err();
        assert!(e.to_string().contains("100000 bytes where 100001"), "{e}");

        let extra = client(serve_once(body.clone()).await);
        let e = extra
            .get_checked("b", "k", &body[..99_999])
            .await
            .unwrap_err();
        assert!(names_a_range_holding(&e.to_string(), 99_999), "{e}");
    }
}
