//! The command line's global settings: built once in `main` from the flags and handed to every
//! command, the bench, the lab, the S3 gateway and the mount. It is the only way a command
//! learns a global flag (there is no process-wide copy to forget to fill in), and the one
//! place the client's settings are made from them ([`Config::client`]).

use std::path::PathBuf;
use tessera_client::{ClientConfig, CongestionKind, Credential, DatagramConfig, TransportKind};

/// What the global flags say.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// `--cluster`: a manager's address (or the replicas', comma-separated) or a cluster file.
    pub cluster: Option<String>,
    /// `--transport`, if given (else the cluster's, else UDP).
    pub transport: Option<TransportKind>,
    /// `--window`: a fixed datagram window, if given.
    pub window: Option<u32>,
    /// `--receive-budget`, if given (0: receiver-driven grants off).
    pub receive_budget: Option<u32>,
    /// `--datagram-bytes`: the largest datagram toward any peer, if given.
    pub datagram_bytes: Option<usize>,
    /// `--key KEYID:SECRET`, if given.
    pub key: Option<String>,
    /// `--secret FILE`, if given.
    pub secret: Option<PathBuf>,
    /// Radon's pacing of every datagram session, with this link rate in bytes/s (no flag:
    /// `tessera lab-client` sets it for the streams of `lab radon` that ask for it).
    pub radon_link_bytes_per_s: Option<u64>,
}

impl Config {
    /// The same settings for another cluster (a daemon's `--manager`, the lab's client).
    pub fn for_cluster(&self, cluster: String) -> Config {
        Config {
            cluster: Some(cluster),
            ..self.clone()
        }
    }

    /// The same settings over `transport`.
    pub fn over(&self, transport: TransportKind) -> Config {
        Config {
            transport: Some(transport),
            ..self.clone()
        }
    }

    /// The datagram protocol's settings of a server: the window choice and the datagram cap.
    pub fn server_datagram(&self) -> DatagramConfig {
        let mut config = DatagramConfig::default();
        if let Some(n) = self.window {
            config.congestion = CongestionKind::Fixed(n);
        }
        config.path_datagram_bytes_max = self.datagram_bytes;
        config
    }

    /// The datagram protocol's settings of a client: the window choice and the receive budget.
    pub fn client_datagram(&self) -> DatagramConfig {
        let mut config = self.server_datagram();
        config.receive_budget_packets = match self.receive_budget {
            Some(0) => None,
            Some(n) => Some(n),
            None => Some(tessera_client::RECEIVE_BUDGET_PACKETS),
        };
        config.radon =
            self.radon_link_bytes_per_s
                .map(|link_bytes_per_s| tessera_client::RadonConfig {
                    link_bytes_per_s,
                    // A stream's period counts its bytes when done, not when sent.
                    send_by_margin_divisor: tessera_datagram::radon::SEND_BY_MARGIN_DIVISOR,
                    ..tessera_client::RadonConfig::default()
                });
        config
    }

    /// A client's settings: the transport given, else the cluster's, else UDP; the datagram
    /// settings; `credential`; and the reserved rate of one stream, if any.
    pub fn client(
        &self,
        cluster_transport: Option<TransportKind>,
        credential: Credential,
        reservation: Option<tessera_client::stream::Reservation>,
    ) -> ClientConfig {
        ClientConfig {
            transport: self.transport.or(cluster_transport).unwrap_or_default(),
            datagram: self.client_datagram(),
            credential: Some(credential),
            reservation,
            ..ClientConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_client::{Claim, Secret};

    fn credential() -> Credential {
        Credential {
            claim: Claim::Admin,
            key: Secret::from_bytes([7; 32]).admin_key(),
        }
    }

    #[test]
    fn every_flag_reaches_the_client_settings() {
        let config = Config {
            transport: Some(TransportKind::Tcp),
            window: Some(4),
            receive_budget: Some(7),
            datagram_bytes: Some(1472),
            ..Config::default()
        };
        let client = config.client(Some(TransportKind::Udp), credential(), None);
        assert_eq!(client.transport, TransportKind::Tcp);
        assert_eq!(client.datagram.receive_budget_packets, Some(7));
        assert_eq!(client.datagram.path_datagram_bytes_max, Some(1472));
        assert_eq!(config.server_datagram().path_datagram_bytes_max, Some(1472));
        assert!(matches!(
            client.datagram.congestion,
            CongestionKind::Fixed(4)
        ));
        // Over another transport, and for another cluster, nothing else is lost.
        let other = config.over(TransportKind::Udp).for_cluster("x:1".into());
        let client = other.client(None, credential(), None);
        assert_eq!(client.transport, TransportKind::Udp);
        assert_eq!(client.datagram.receive_budget_packets, Some(7));
        assert_eq!(other.cluster.as_deref(), Some("x:1"));
    }

    #[test]
    fn unset_flags_leave_the_cluster_and_the_defaults() {
        let client = Config::default().client(Some(TransportKind::Tcp), credential(), None);
        assert_eq!(client.transport, TransportKind::Tcp);
        let budget = tessera_client::RECEIVE_BUDGET_PACKETS;
        assert_eq!(client.datagram.receive_budget_packets, Some(budget));
        let off = Config {
            receive_budget: Some(0),
            ..Config::default()
        };
        assert_eq!(off.client_datagram().receive_budget_packets, None);
    }
}
