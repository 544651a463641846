//! The server's Prometheus metrics: the requests it serves by kind (requests, errors, bytes
//! in and out, latency: [`tessera_transport::metrics`], shared by every daemon), reads
//! answered inline or on the blocking pool, and the datagram transport's counters
//! (retransmissions, timeouts, grants, drops), read at each scrape; the bytes moved for
//! rebuild and scrub (background service); the disk's size, free space and the bytes the
//! store occupies ([`DiskGauge`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_store::{DiskUsage, Store};
pub use tessera_transport::metrics::{kind_of, TOTAL_NAMES};
use tessera_transport::metrics::{render, RequestMetrics};

/// Labels of a transport counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CounterLabel {
    /// The counter's name in the transport.
    pub counter: String,
}

/// Labels of a disk gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DiskLabel {
    /// `total`, `available` (free for the store) or `stored` (the store's files).
    pub bytes: String,
}

/// A server's metrics.
pub struct ServerMetrics {
    registry: Registry,
    requests: RequestMetrics,
    transport: Family<CounterLabel, Counter>,
    /// Payload bytes in and out of rebuild and scrub requests.
    background: Counter<u64, AtomicU64>,
    disk: Family<DiskLabel, Gauge<u64, AtomicU64>>,
}

/// How long a disk usage walk is reused: a walk lists every file of the store.
pub const DISK_USAGE_MAX_AGE: Duration = Duration::from_secs(5);

/// The store's disk usage, walked at most once per [`DISK_USAGE_MAX_AGE`].
pub struct DiskGauge {
    store: Arc<Store>,
    last: tokio::sync::Mutex<Option<(Instant, DiskUsage)>>,
}

impl DiskGauge {
    /// A gauge over `store`'s directory.
    pub fn new(store: Arc<Store>) -> DiskGauge {
        DiskGauge {
            store,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// The usage, walked anew if the last walk is older than [`DISK_USAGE_MAX_AGE`]; `None`
    /// if the disk cannot be asked (then the scrape goes on without it).
    pub async fn get(&self) -> Option<DiskUsage> {
        let mut last = self.last.lock().await;
        if let Some((at, usage)) = *last {
            if at.elapsed() < DISK_USAGE_MAX_AGE {
                return Some(usage);
            }
        }
        let store = self.store.clone();
        match crate::blocking(move || store.disk_usage()).await {
            Ok(usage) => {
                *last = Some((Instant::now(), usage));
                Some(usage)
            }
            Err(e) => {
                tracing::warn!("disk usage: {e}");
                None
            }
        }
    }
}

/// The disk usage as `TransportCounters` reports it (`tessera top`, the mount's `statfs`).
pub fn disk_counters(usage: &DiskUsage) -> [(String, u64); 3] {
    [
        ("disk_total_bytes".into(), usage.total),
        ("disk_available_bytes".into(), usage.available),
        ("disk_stored_bytes".into(), usage.stored),
    ]
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
        let background = Counter::default();
        registry.register(
            "background_bytes",
            "Payload bytes received and sent for rebuild and scrub (background service)",
            background.clone(),
        );
        let disk = Family::<DiskLabel, Gauge<u64, AtomicU64>>::default();
        registry.register(
            "disk_bytes",
            "The store's disk: total size, bytes available to it, bytes its files occupy",
            disk.clone(),
        );
        ServerMetrics {
            registry,
            requests,
            transport,
            background,
            disk,
        }
    }
}

impl ServerMetrics {
    /// Count one request answered.
    pub fn observe(&self, kind: String, received: usize, sent: usize, error: bool, took: Duration) {
        self.requests.observe(kind, received, sent, error, took);
    }

    /// Count payload bytes moved for rebuild or scrub.
    pub fn observe_background(&self, bytes: usize) {
        self.background.inc_by(bytes as u64);
    }

    /// The sums over all kinds, by the names in [`TOTAL_NAMES`], and the background bytes
    /// (the counters a `TransportCounters` request reports with the transport's).
    pub fn totals(&self) -> Vec<(String, u64)> {
        let mut totals = self.requests.totals();
        totals.push(("background_bytes".into(), self.background.get()));
        totals
    }

    /// The metrics in Prometheus's text format, with the transport's counters and the disk's
    /// usage as given.
    pub fn render(&self, transport: &[(String, u64)], disk: Option<DiskUsage>) -> String {
        for (name, value) in transport {
            let counter = self.transport.get_or_create(&CounterLabel {
                counter: name.clone(),
            });
            counter.inner().store(*value, Ordering::Relaxed);
        }
        if let Some(disk) = disk {
            for (bytes, value) in [
                ("total", disk.total),
                ("available", disk.available),
                ("stored", disk.stored),
            ] {
                let label = DiskLabel {
                    bytes: bytes.into(),
                };
                self.disk.get_or_create(&label).set(value);
            }
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
        metrics.observe_background(300);
        let disk = DiskUsage {
            total: 1000,
            available: 400,
            stored: 250,
        };
        let text = metrics.render(&[("retransmitted".into(), 7)], Some(disk));
        for line in [
            "tessera_server_background_bytes_total 300",
            "tessera_server_disk_bytes{bytes=\"total\"} 1000",
            "tessera_server_disk_bytes{bytes=\"available\"} 400",
            "tessera_server_disk_bytes{bytes=\"stored\"} 250",
            "tessera_server_requests_total{kind=\"Read\"} 1",
            "tessera_server_sent_bytes_total{kind=\"Read\"} 4096",
            "tessera_server_transport_total{counter=\"retransmitted\"} 7",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
