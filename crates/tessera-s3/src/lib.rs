//! Tessera's S3 gateway: the S3 protocol over the client library.
//!
//! [`s3s`] parses requests, checks their AWS Signature V4 against the gateway's access key and
//! writes the answers; this crate owns what they mean for Tessera's namespace ([`names`]:
//! buckets are top-level directories, objects files under them), the small records the
//! gateway keeps beside the data ([`meta`]), listings ([`listing`]) and moving bodies in and
//! out in stripe-sized chunks, so that memory stays bounded whatever the object's size. A put
//! writes a pending file that takes the key only once synced (an interrupted upload leaves
//! the object it replaces whole).

mod conditions;
mod copy;
mod etag_md5;
mod gateway;
pub mod listing;
pub mod meta;
pub mod metrics;
pub mod multipart;
pub mod names;
mod ops;

pub use gateway::{Gateway, IDLE_TIMEOUT, SCHEME_HEADER, STRIPE_UNIT_HEADER, WIDTH_HEADER};

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use metrics::GatewayMetrics;
use rand::Rng;
use s3s::auth::{S3Auth, SecretKey, SimpleAuth};
use s3s::service::{S3Service, S3ServiceBuilder};
use std::sync::Arc;
use tokio::net::TcpListener;

/// The access key and secret key requests must be signed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// Access key id.
    pub access: String,
    /// Secret access key.
    pub secret: String,
}

impl Keys {
    /// A fresh pair: a 20-character access key and a 40-character secret from the OS's
    /// random source (the lengths AWS uses).
    pub fn generate() -> Keys {
        const ACCESS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
        const SECRET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut rng = rand::rngs::OsRng;
        let mut pick = |set: &[u8], n: usize| -> String {
            (0..n)
                .map(|_| set[rng.gen_range(0..set.len())] as char)
                .collect()
        };
        Keys {
            access: pick(ACCESS, 20),
            secret: pick(SECRET, 40),
        }
    }
}

/// The gateway's one access key. An unknown key is `InvalidAccessKeyId`, as in AWS (s3s's
/// `SimpleAuth` alone answers `NotSignedUp`, which clients do not expect).
struct GatewayAuth(SimpleAuth);

#[async_trait::async_trait]
impl S3Auth for GatewayAuth {
    async fn get_secret_key(&self, access_key: &str) -> s3s::S3Result<SecretKey> {
        self.0.get_secret_key(access_key).await.map_err(|_| {
            s3s::s3_error!(
                InvalidAccessKeyId,
                "the access key '{access_key}' is not this gateway's"
            )
        })
    }
}

/// Answers `request` with `service`, closing the connection after an error answer to a
/// request that came with a body. s3s refuses a bad key or a missing bucket before it reads
/// the body, and a client that sent `Expect: 100-continue` (boto3 does for every put) then
/// never sends it: kept open, the connection would take the first bytes of the client's next
/// request for that body, and answer it with a bare 400 (seen as a flaky test, one put in
/// ten under load). A fresh connection per refused upload costs nothing that matters.
async fn closing_after_unread_body(
    service: S3Service,
    request: http::Request<hyper::body::Incoming>,
    metrics: Option<Arc<GatewayMetrics>>,
) -> Result<s3s::HttpResponse, s3s::HttpError> {
    let started = std::time::Instant::now();
    let kind = metrics.as_ref().map(|_| {
        let uri = request.uri();
        metrics::kind_of(request.method(), uri.path(), uri.query())
    });
    let received = metrics::content_length(request.headers());
    let has_body = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .is_some_and(|len| len.as_bytes() != b"0")
        || request
            .headers()
            .contains_key(http::header::TRANSFER_ENCODING);
    let mut response = hyper::service::Service::call(&service, request).await?;
    let failed = response.status().is_client_error() || response.status().is_server_error();
    if let (Some(metrics), Some(kind)) = (metrics, kind) {
        let sent = metrics::content_length(response.headers());
        metrics.observe(kind, received, sent, failed, started.elapsed());
    }
    if has_body && failed {
        response.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    Ok(response)
}

/// Serve S3 on `listener` until the task is dropped, with requests signed by `keys` (any
/// other request gets `AccessDenied`), counting them in `metrics` if given.
pub async fn serve(
    listener: TcpListener,
    gateway: Gateway,
    keys: Keys,
    metrics: Option<Arc<GatewayMetrics>>,
) -> std::io::Result<()> {
    let service = {
        let mut builder = S3ServiceBuilder::new(gateway.clone());
        builder.set_auth(GatewayAuth(SimpleAuth::from_single(
            keys.access,
            keys.secret,
        )));
        builder.build()
    };
    // Multipart uploads are pending files: keep them alive while the gateway runs.
    let sweeper = {
        let gateway = gateway.clone();
        tokio::spawn(async move {
            loop {
                gateway.sweep_uploads().await;
                tokio::time::sleep(multipart::RENEW_EVERY).await;
            }
        })
    };
    let _stop_sweeper = AbortOnDrop(sweeper);
    // HTTP/1 only (S3 clients speak it; hyper has no idle limit for HTTP/2), and a
    // connection that sends no whole request head within the idle time, also between
    // requests, is closed: idle and slow peers cannot pile up until descriptors run out.
    let mut connections = ConnBuilder::new(TokioExecutor::new()).http1_only();
    connections
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(gateway.idle);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors and the like: wait instead of spinning.
                tracing::warn!("cannot accept a connection: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let (service, metrics) = (service.clone(), metrics.clone());
        let service = hyper::service::service_fn(move |request| {
            closing_after_unread_body(service.clone(), request, metrics.clone())
        });
        let connection = connections
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("connection from {peer}: {e}");
            }
        });
    }
}

/// Aborts a task when dropped (the gateway's background work ends with `serve`).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
