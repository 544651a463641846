//! What every daemon counts of the requests it serves, for its Prometheus endpoint
//! (`--metrics`; the `prometheus-client` crate, the Prometheus project's own Rust client):
//! requests, errors, payload bytes in and out and a latency histogram, each by request kind,
//! and their sums over all kinds (which `tessera top` reads).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Labels of a per-kind metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// The request's kind (`Read`, `Write`, `Lookup`, ...).
    pub kind: String,
}

/// The names [`RequestMetrics::totals`] reports its sums under.
pub const TOTAL_NAMES: [&str; 4] = [
    "requests_served",
    "requests_failed",
    "payload_bytes_received",
    "payload_bytes_sent",
];

fn latency_histogram() -> Histogram {
    // 50 us to ~1.6 s, doubling.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.000_05, 2.0, 16,
    ))
}

/// Requests served by kind, registered in a daemon's registry.
pub struct RequestMetrics {
    requests: Family<KindLabel, Counter>,
    errors: Family<KindLabel, Counter>,
    bytes_in: Family<KindLabel, Counter>,
    bytes_out: Family<KindLabel, Counter>,
    latency: Family<KindLabel, Histogram, fn() -> Histogram>,
    /// Over all kinds: requests, errors, payload bytes received and sent.
    totals: [AtomicU64; 4],
}

impl RequestMetrics {
    /// The metrics, registered in `registry` (under its prefix).
    pub fn register(registry: &mut Registry) -> RequestMetrics {
        let metrics = RequestMetrics {
            requests: Family::default(),
            errors: Family::default(),
            bytes_in: Family::default(),
            bytes_out: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            totals: Default::default(),
        };
        let m = &metrics;
        registry.register("requests", "Requests served, by kind", m.requests.clone());
        let errors = "Requests answered with an error, by kind";
        registry.register("errors", errors, m.errors.clone());
        let received = "Payload bytes received, by kind";
        registry.register("received_bytes", received, m.bytes_in.clone());
        registry.register(
            "sent_bytes",
            "Payload bytes answered, by kind",
            m.bytes_out.clone(),
        );
        let latency = "Time from a request's arrival to its answer, by kind";
        registry.register("request_seconds", latency, m.latency.clone());
        metrics
    }

    /// Count one request answered.
    pub fn observe(&self, kind: String, received: usize, sent: usize, error: bool, took: Duration) {
        let label = KindLabel { kind };
        self.requests.get_or_create(&label).inc();
        if error {
            self.errors.get_or_create(&label).inc();
        }
        self.bytes_in.get_or_create(&label).inc_by(received as u64);
        self.bytes_out.get_or_create(&label).inc_by(sent as u64);
        self.latency
            .get_or_create(&label)
            .observe(took.as_secs_f64());
        let add = [1, u64::from(error), received as u64, sent as u64];
        for (total, n) in self.totals.iter().zip(add) {
            total.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The sums over all kinds, by the names in [`TOTAL_NAMES`].
    pub fn totals(&self) -> Vec<(String, u64)> {
        TOTAL_NAMES
            .iter()
            .zip(&self.totals)
            .map(|(name, total)| (name.to_string(), total.load(Ordering::Relaxed)))
            .collect()
    }
}

/// A request's kind: the name of its variant.
pub fn kind_of(request: &impl std::fmt::Debug) -> String {
    let text = format!("{request:?}");
    let end = text
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(text.len());
    text[..end].to_string()
}

/// A registry's metrics in Prometheus's text format.
pub fn render(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)
        .expect("writing to a String does not fail");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    #[allow(dead_code)]
    enum Request {
        Read { len: u64 },
        Ping,
    }

    #[test]
    fn counts_bytes_latency_and_totals_by_kind() {
        let mut registry = Registry::with_prefix("t");
        let metrics = RequestMetrics::register(&mut registry);
        assert_eq!(kind_of(&Request::Read { len: 4 }), "Read");
        assert_eq!(kind_of(&Request::Ping), "Ping");
        metrics.observe("Read".into(), 10, 4096, false, Duration::from_micros(70));
        metrics.observe("Read".into(), 10, 0, true, Duration::from_millis(3));
        let text = render(&registry);
        for line in [
            "t_requests_total{kind=\"Read\"} 2",
            "t_errors_total{kind=\"Read\"} 1",
            "t_received_bytes_total{kind=\"Read\"} 20",
            "t_sent_bytes_total{kind=\"Read\"} 4096",
            "t_request_seconds_count{kind=\"Read\"} 2",
            "t_request_seconds_bucket{le=\"0.0001\",kind=\"Read\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        let totals: Vec<u64> = metrics.totals().into_iter().map(|(_, n)| n).collect();
        assert_eq!(totals, [2, 1, 20, 4096]);
    }
}
