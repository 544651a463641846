//! The server's Prometheus metrics: the requests it serves by kind (requests, errors, bytes
//! in and out, latency: [`tessera_transport::metrics`], shared by every daemon), reads
//! answered inline or on the blocking pool, and the datagram transport's counters
//! (retransmissions, timeouts, grants, drops), read at each scrape.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::sync::atomic::Ordering;
use std::time::Duration;
pub use tessera_transport::metrics::{kind_of, TOTAL_NAMES};
use tessera_transport::metrics::{render, RequestMetrics};

/// Labels of a transport counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CounterLabel {
    /// The counter's name in the transport.
    pub counter: String,
}

/// A server's metrics.
pub struct ServerMetrics {
    registry: Registry,
    requests: RequestMetrics,
    transport: Family<CounterLabel, Counter>,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("tessera_server");
        let requests = RequestMetrics::register(&mut registry);
        let transport = Family::<CounterLabel, Counter>::default();
        registry.register(
            "transport",
            "The transport's counters (datagram: retransmissions, timeouts, grants, drops)",
            transport.clone(),
        );
        ServerMetrics {
            registry,
            requests,
            transport,
        }
    }
}

impl ServerMetrics {
    /// Count one request answered.
    pub fn observe(&self, kind: String, received: usize, sent: usize, error: bool, took: Duration) {
        self.requests.observe(kind, received, sent, error, took);
    }

    /// The sums over all kinds, by the names in [`TOTAL_NAMES`] (the counters a
    /// `TransportCounters` request reports with the transport's).
    pub fn totals(&self) -> Vec<(String, u64)> {
        self.requests.totals()
    }

    /// The metrics in Prometheus's text format, with the transport's counters as given.
    pub fn render(&self, transport: &[(String, u64)]) -> String {
        for (name, value) in transport {
            let counter = self.transport.get_or_create(&CounterLabel {
                counter: name.clone(),
            });
            counter.inner().store(*value, Ordering::Relaxed);
        }
        render(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_requests_by_kind_and_the_transports_counters() {
        let metrics = ServerMetrics::default();
        metrics.observe("Read".into(), 10, 4096, false, Duration::from_micros(70));
        let text = metrics.render(&[("retransmitted".into(), 7)]);
        for line in [
            "tessera_server_requests_total{kind=\"Read\"} 1",
            "tessera_server_sent_bytes_total{kind=\"Read\"} 4096",
            "tessera_server_transport_total{counter=\"retransmitted\"} 7",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
