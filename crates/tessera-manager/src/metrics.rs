//! The manager's Prometheus metrics (`tessera manager --metrics ADDR`): the requests it
//! serves by kind ([`tessera_transport::metrics`], as every daemon counts them) and, read at
//! each scrape, its servers by state.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::time::Duration;
pub use tessera_transport::metrics::kind_of;
use tessera_transport::metrics::{render, RequestMetrics};
use tessera_wire::{ServerState, ServerStatus};

/// Labels of the servers-by-state gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// `up`, `down` or `stale`.
    pub state: String,
}

/// A manager's metrics.
pub struct ManagerMetrics {
    registry: Registry,
    requests: RequestMetrics,
    servers: Family<StateLabel, Gauge>,
}

impl Default for ManagerMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("tessera_manager");
        let requests = RequestMetrics::register(&mut registry);
        let servers = Family::<StateLabel, Gauge>::default();
        registry.register("servers", "Storage servers, by state", servers.clone());
        ManagerMetrics {
            registry,
            requests,
            servers,
        }
    }
}

impl ManagerMetrics {
    /// Count one request answered.
    pub fn observe(&self, kind: String, received: usize, sent: usize, error: bool, took: Duration) {
        self.requests.observe(kind, received, sent, error, took);
    }

    /// The metrics in Prometheus's text format, with `servers` as the manager has them now.
    pub fn render(&self, servers: &[ServerStatus]) -> String {
        for state in [ServerState::Up, ServerState::Down, ServerState::Stale] {
            let count = servers.iter().filter(|s| s.state == state).count();
            let label = StateLabel {
                state: state.name().to_string(),
            };
            self.servers.get_or_create(&label).set(count as i64);
        }
        render(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_requests_and_servers_by_state() {
        let metrics = ManagerMetrics::default();
        metrics.observe("Lookup".into(), 30, 0, true, Duration::from_micros(80));
        let server = |id, state| ServerStatus {
            id,
            addr: "127.0.0.1:1".into(),
            incarnation: Default::default(),
            state,
        };
        let servers = [
            server(1, ServerState::Up),
            server(2, ServerState::Up),
            server(3, ServerState::Stale),
        ];
        let text = metrics.render(&servers);
        for line in [
            "tessera_manager_requests_total{kind=\"Lookup\"} 1",
            "tessera_manager_errors_total{kind=\"Lookup\"} 1",
            "tessera_manager_servers{state=\"up\"} 2",
            "tessera_manager_servers{state=\"down\"} 0",
            "tessera_manager_servers{state=\"stale\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
