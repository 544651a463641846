//! The gateway's Prometheus metrics (`tessera s3 --metrics ADDR`): requests, errors (4xx and
//! 5xx answers), body bytes in and out (as their `Content-Length` says) and the time to the
//! answer's head, by kind of request ([`tessera_transport::metrics`], as every daemon counts
//! them). A kind is the method and what it names, e.g. `GET object`, `PUT part`,
//! `POST uploads`, `GET bucket list`: a small fixed set, whatever the keys.

use prometheus_client::registry::Registry;
use std::time::Duration;
use tessera_transport::metrics::{render, RequestMetrics};

/// The gateway's metrics.
pub struct GatewayMetrics {
    registry: Registry,
    requests: RequestMetrics,
}

impl Default for GatewayMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("tessera_s3");
        let requests = RequestMetrics::register(&mut registry);
        GatewayMetrics { registry, requests }
    }
}

impl GatewayMetrics {
    /// Count one request answered.
    pub fn observe(&self, kind: String, received: u64, sent: u64, error: bool, took: Duration) {
        self.requests
            .observe(kind, received as usize, sent as usize, error, took);
    }

    /// The metrics in Prometheus's text format.
    pub fn text(&self) -> String {
        render(&self.registry)
    }
}

/// The kind of an S3 request, from its method, path and query.
pub fn kind_of(method: &http::Method, path: &str, query: Option<&str>) -> String {
    let segments = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .count();
    let target = match segments {
        0 => "service",
        1 => "bucket",
        _ => "object",
    };
    let has = |key: &str| {
        query.is_some_and(|q| q.split('&').any(|pair| pair.split('=').next() == Some(key)))
    };
    let detail = if has("partNumber") && has("uploadId") {
        "part"
    } else if has("uploadId") {
        "upload"
    } else if has("uploads") {
        "uploads"
    } else if has("delete") {
        "delete-objects"
    } else if target == "bucket" && *method == http::Method::GET {
        "list"
    } else {
        ""
    };
    let method = match *method {
        http::Method::GET => "GET",
        http::Method::PUT => "PUT",
        http::Method::POST => "POST",
        http::Method::DELETE => "DELETE",
        http::Method::HEAD => "HEAD",
        _ => "OTHER",
    };
    match detail {
        "" => format!("{method} {target}"),
        detail => format!("{method} {target} {detail}"),
    }
}

/// The `Content-Length` of a request's or answer's headers (0 if none or unreadable).
pub fn content_length(headers: &http::HeaderMap) -> u64 {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    #[test]
    fn kinds_name_the_operation_not_the_key() {
        assert_eq!(kind_of(&Method::GET, "/", None), "GET service");
        assert_eq!(
            kind_of(&Method::GET, "/b", Some("list-type=2")),
            "GET bucket list"
        );
        assert_eq!(kind_of(&Method::PUT, "/b", None), "PUT bucket");
        assert_eq!(
            kind_of(&Method::GET, "/b/a/very/deep/key", None),
            "GET object"
        );
        assert_eq!(
            kind_of(&Method::POST, "/b/k", Some("uploads")),
            "POST object uploads"
        );
        let part = Some("partNumber=3&uploadId=xyz");
        assert_eq!(kind_of(&Method::PUT, "/b/k", part), "PUT object part");
        assert_eq!(
            kind_of(&Method::POST, "/b", Some("delete")),
            "POST bucket delete-objects"
        );
        assert_eq!(kind_of(&Method::PATCH, "/b/k", None), "OTHER object");
    }

    #[test]
    fn renders_requests_by_kind() {
        let metrics = GatewayMetrics::default();
        metrics.observe("PUT object".into(), 100, 0, false, Duration::from_millis(2));
        metrics.observe("GET object".into(), 0, 0, true, Duration::from_millis(1));
        let text = metrics.text();
        for line in [
            "tessera_s3_requests_total{kind=\"PUT object\"} 1",
            "tessera_s3_received_bytes_total{kind=\"PUT object\"} 100",
            "tessera_s3_errors_total{kind=\"GET object\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
