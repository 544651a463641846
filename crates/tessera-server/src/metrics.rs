//! The server's Prometheus metrics (the `prometheus-client` crate: the Prometheus project's
//! own Rust client, with the text exposition format): requests, errors, bytes in and out
//! and latency by request kind, reads answered inline or on the blocking pool, and the
//! datagram transport's counters (retransmissions, timeouts, grants, drops), read at each
//! scrape.

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
    /// The request's kind (`Read`, `Write`, `LockParity`, ...).
    pub kind: String,
}

/// Labels of a transport counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CounterLabel {
    /// The counter's name in the transport.
    pub counter: String,
}

fn latency_histogram() -> Histogram {
    // 50 us to ~1.6 s, doubling.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.000_05, 2.0, 16,
    ))
}

/// A server's metrics.
pub struct ServerMetrics {
    registry: Registry,
    requests: Family<KindLabel, Counter>,
    errors: Family<KindLabel, Counter>,
    bytes_in: Family<KindLabel, Counter>,
    bytes_out: Family<KindLabel, Counter>,
    latency: Family<KindLabel, Histogram, fn() -> Histogram>,
    transport: Family<CounterLabel, Counter>,
    /// Over all kinds: requests, errors, payload bytes received and sent.
    totals: [AtomicU64; 4],
}

/// The names [`ServerMetrics::totals`] reports its sums under.
pub const TOTAL_NAMES: [&str; 4] = [
    "requests_served",
    "requests_failed",
    "payload_bytes_received",
    "payload_bytes_sent",
];

impl Default for ServerMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("tessera_server");
        let requests = Family::<KindLabel, Counter>::default();
        let errors = Family::<KindLabel, Counter>::default();
        let bytes_in = Family::<KindLabel, Counter>::default();
        let bytes_out = Family::<KindLabel, Counter>::default();
        let latency = Family::<KindLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        let transport = Family::<CounterLabel, Counter>::default();
        registry.register("requests", "Requests served, by kind", requests.clone());
        registry.register(
            "errors",
            "Requests answered with an error, by kind",
            errors.clone(),
        );
        registry.register(
            "received_bytes",
            "Payload bytes received, by kind",
            bytes_in.clone(),
        );
        registry.register(
            "sent_bytes",
            "Payload bytes answered, by kind",
            bytes_out.clone(),
        );
        registry.register(
            "request_seconds",
            "Time from a request's arrival to its answer, by kind",
            latency.clone(),
        );
        registry.register(
            "transport",
            "The transport's counters (datagram: retransmissions, timeouts, grants, drops)",
            transport.clone(),
        );
        ServerMetrics {
            registry,
            requests,
            errors,
            bytes_in,
            bytes_out,
            latency,
            transport,
            totals: Default::default(),
        }
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

impl ServerMetrics {
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

    /// The sums over all kinds, by the names in [`TOTAL_NAMES`] (the counters a
    /// `TransportCounters` request reports with the transport's).
    pub fn totals(&self) -> Vec<(String, u64)> {
        TOTAL_NAMES
            .iter()
            .zip(&self.totals)
            .map(|(name, total)| (name.to_string(), total.load(Ordering::Relaxed)))
            .collect()
    }

    /// The metrics in Prometheus's text format, with the transport's counters as given.
    pub fn render(&self, transport: &[(String, u64)]) -> String {
        for (name, value) in transport {
            let counter = self.transport.get_or_create(&CounterLabel {
                counter: name.clone(),
            });
            counter.inner().store(*value, Ordering::Relaxed);
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String does not fail");
        text
    }
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
    fn renders_counts_bytes_and_latency_by_kind() {
        let metrics = ServerMetrics::default();
        assert_eq!(kind_of(&Request::Read { len: 4 }), "Read");
        assert_eq!(kind_of(&Request::Ping), "Ping");
        metrics.observe("Read".into(), 10, 4096, false, Duration::from_micros(70));
        metrics.observe("Read".into(), 10, 0, true, Duration::from_millis(3));
        let text = metrics.render(&[("retransmitted".into(), 7)]);
        for line in [
            "tessera_server_requests_total{kind=\"Read\"} 2",
            "tessera_server_errors_total{kind=\"Read\"} 1",
            "tessera_server_received_bytes_total{kind=\"Read\"} 20",
            "tessera_server_sent_bytes_total{kind=\"Read\"} 4096",
            "tessera_server_request_seconds_count{kind=\"Read\"} 2",
            "tessera_server_request_seconds_bucket{le=\"0.0001\",kind=\"Read\"} 1",
            "tessera_server_transport_total{counter=\"retransmitted\"} 7",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        let totals: Vec<u64> = metrics.totals().into_iter().map(|(_, n)| n).collect();
        assert_eq!(totals, [2, 1, 20, 4096]);
    }
}
