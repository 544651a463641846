//! The manager's Prometheus metrics (`tessera manager --metrics ADDR`): the requests it
//! serves by kind ([`tessera_transport::metrics`], as every daemon counts them) and, read at
//! each scrape, its servers by state and what each owes (rebuild's progress: it falls to 0).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::time::Duration;
pub use tessera_transport::metrics::kind_of;
use tessera_transport::metrics::{render, RequestMetrics};
use tessera_wire::{ServerId, ServerState, ServerStatus};

/// Labels of the servers-by-state gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// `up`, `down` or `stale`.
    pub state: String,
}

/// Labels of the owed gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OwedLabel {
    /// The server's id.
    pub server: String,
    /// `whole_files`, `files` (owed in part) or `stripes` (of those).
    pub what: String,
}

/// What one server owes ([`crate::Manager::owed`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Owed {
    /// Files owed whole: made while it was down, or its store was wiped.
    pub whole_files: u64,
    /// Files owed in part.
    pub files: u64,
    /// Stripes of those.
    pub stripes: u64,
}

impl Owed {
    /// Counts one file's debt: the stripe ranges it missed (a range to `u64::MAX`: the
    /// whole file).
    pub fn add(&mut self, missed: &[tessera_wire::IndexRange]) {
        if missed.iter().any(|r| r.end == u64::MAX) {
            self.whole_files += 1;
        } else if !missed.is_empty() {
            self.files += 1;
            self.stripes += missed.iter().map(|r| r.end - r.start).sum::<u64>();
        }
    }
}

/// A manager's metrics.
pub struct ManagerMetrics {
    registry: Registry,
    requests: RequestMetrics,
    servers: Family<StateLabel, Gauge>,
    owed: Family<OwedLabel, Gauge>,
}

impl Default for ManagerMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("tessera_manager");
        let requests = RequestMetrics::register(&mut registry);
        let servers = Family::<StateLabel, Gauge>::default();
        registry.register("servers", "Storage servers, by state", servers.clone());
        let owed = Family::<OwedLabel, Gauge>::default();
        registry.register(
            "owed",
            "What each server owes until rebuilt: whole files, files in part, their stripes",
            owed.clone(),
        );
        ManagerMetrics {
            registry,
            requests,
            servers,
            owed,
        }
    }
}

impl ManagerMetrics {
    /// Count one request answered.
    pub fn observe(&self, kind: String, received: usize, sent: usize, error: bool, took: Duration) {
        self.requests.observe(kind, received, sent, error, took);
    }

    /// The metrics in Prometheus's text format, with `servers` and what they owe as the
    /// manager has them now.
    pub fn render(&self, servers: &[ServerStatus], owed: &BTreeMap<ServerId, Owed>) -> String {
        // A server forgotten since the last scrape must not keep its last values.
        self.owed.clear();
        for (server, owes) in owed {
            for (what, value) in [
                ("whole_files", owes.whole_files),
                ("files", owes.files),
                ("stripes", owes.stripes),
            ] {
                let label = OwedLabel {
                    server: server.to_string(),
                    what: what.to_string(),
                };
                self.owed.get_or_create(&label).set(value as i64);
            }
        }
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
        let owes = Owed {
            whole_files: 0,
            files: 2,
            stripes: 17,
        };
        let gone = BTreeMap::from([(9, owes)]);
        let text = metrics.render(&servers, &gone);
        assert!(text.contains("tessera_manager_owed{server=\"9\",what=\"stripes\"} 17"));
        let owed = BTreeMap::from([(3, owes), (1, Owed::default())]);
        let text = metrics.render(&servers, &owed);
        assert!(
            !text.contains("server=\"9\""),
            "a forgotten server stays:\n{text}"
        );
        for line in [
            "tessera_manager_owed{server=\"3\",what=\"stripes\"} 17",
            "tessera_manager_owed{server=\"3\",what=\"files\"} 2",
            "tessera_manager_owed{server=\"1\",what=\"whole_files\"} 0",
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
