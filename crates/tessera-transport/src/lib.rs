//! Moves Tessera frames between peers.
//!
//! This crate owns the [`Transport`] trait, the one interface through which clients reach
//! storage servers and the manager, and the [`FrameHandler`] trait through which a daemon
//! answers them, with their TCP implementations ([`TcpTransport`], [`serve_tcp`]). A transport
//! carries opaque request and response frames, matched by request id and pipelined: many
//! requests may be in flight on one connection and their answers may come back in any order.
//! It knows nothing of what the messages mean; `tessera-wire` does. The adaptive datagram
//! transport plugs in behind the same two traits. A TCP server bounds what its peers may
//! hold ([`limits`]): connections per address and in all, idle and half-sent time, and the
//! memory of frames in flight.
//! Every connection opens with a mutual handshake (`handshake.rs`): a client presents a
//! [`Credential`], a daemon says through [`FrameHandler::peer_key`] which keys it accepts, and
//! nothing else is read before it.

mod answers;
mod frame_buffer;
mod handshake;
pub mod limits;
pub mod managers;
mod mem;
pub mod metrics;
mod tcp;
mod udp;

use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use tessera_wire::WireError;

pub use handshake::Accepted;
pub use limits::TcpLimits;
pub use managers::ManagerReplicas;
pub use mem::{MemFaults, MemNetwork, MemStats, MemTransport};
pub use tcp::{listen, serve_tcp, serve_tcp_limited, TcpConfig, TcpTransport, LISTEN_BACKLOG};
pub use tessera_auth::{Claim, Credential, Key, Refusal};
pub use tessera_datagram::{Config as DatagramConfig, CongestionKind};
pub use udp::{serve_udp, UdpConfig, UdpCounters, UdpServer, UdpTransport};

/// Which transport carries client-server traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportKind {
    /// Tessera's adaptive datagram transport (the default).
    #[default]
    Udp,
    /// One pipelined TCP connection per server.
    Tcp,
}

impl TransportKind {
    /// The name the command line uses.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Udp => "udp",
            TransportKind::Tcp => "tcp",
        }
    }
}

impl std::str::FromStr for TransportKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "udp" => Ok(TransportKind::Udp),
            "tcp" => Ok(TransportKind::Tcp),
            other => Err(format!("unknown transport '{other}' (expected udp or tcp)")),
        }
    }
}

/// A boxed, sendable future, so that the traits stay object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Identifies one connection (or session) at a server; parity locks belong to it.
pub type ConnectionId = u64;

/// Why a call did not get an answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// Nothing accepted the connection at that address.
    #[error("cannot connect to {addr}: {detail}")]
    Connect {
        /// The address tried.
        addr: SocketAddr,
        /// What the OS said.
        detail: String,
    },
    /// No answer within the request timeout.
    #[error("{addr} did not answer within {timeout_ms} ms")]
    Timeout {
        /// The peer.
        addr: SocketAddr,
        /// The timeout that ran out.
        timeout_ms: u64,
    },
    /// The connection broke before the answer came.
    #[error("connection to {addr} lost: {detail}")]
    Disconnected {
        /// The peer.
        addr: SocketAddr,
        /// Why.
        detail: String,
    },
    /// The peer's answer did not decode.
    #[error("bad answer from {addr}: {error}")]
    Protocol {
        /// The peer.
        addr: SocketAddr,
        /// The decoding error.
        error: WireError,
    },
    /// The peer refused to authenticate us.
    #[error("{addr} refused the connection: {refusal}")]
    Refused {
        /// The peer.
        addr: SocketAddr,
        /// Why.
        refusal: Refusal,
    },
    /// The peer could not prove that it holds our key: it is not a daemon of this cluster
    /// (or the key is wrong). Nothing was sent to it.
    #[error("{addr} could not prove it holds our key: the key is wrong, or it is not a daemon of this cluster")]
    NotAuthentic {
        /// The peer.
        addr: SocketAddr,
    },
}

/// An answer: the serialized response message and its bulk payload.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Serialized response message.
    pub message: Bytes,
    /// Bulk data.
    pub payload: Bytes,
}

/// A way for a client to send requests and receive answers.
pub trait Transport: Send + Sync + 'static {
    /// Send a request (serialized message plus payload) to `addr` and wait for its answer.
    fn call(
        &self,
        addr: SocketAddr,
        message: Bytes,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<Reply, TransportError>>;

    /// Like [`call`](Self::call), saying how large the answer frame will be (`None`: unknown),
    /// so that a receiver-driven transport can grant the answer its share of the receive
    /// budget before it is sent. Others ignore the hint.
    fn call_expecting(
        &self,
        addr: SocketAddr,
        message: Bytes,
        payload: Bytes,
        reply_bytes: Option<usize>,
    ) -> BoxFuture<'static, Result<Reply, TransportError>> {
        let _ = reply_bytes;
        self.call(addr, message, payload)
    }

    /// The transport's own counters by name (the datagram endpoint's statistics); empty for
    /// transports that keep none.
    fn counters(&self) -> BoxFuture<'static, Vec<(String, u64)>> {
        Box::pin(async { Vec::new() })
    }

    /// The client's reserved stream starts its periods at `at` (its deadlines are their
    /// ends): a transport that paces reserved sessions (the datagram one) counts their
    /// periods from it. Others ignore it.
    fn start_periods(&self, at: std::time::Instant) {
        let _ = at;
    }

    /// Gets ready to call `addr` (the datagram transport keys a session to it), so that a
    /// caller about to call several peers one after another can pay their handshakes at
    /// once rather than one per call. A failure is left for the first call to meet. Others
    /// do nothing (a TCP connection is opened by its first call).
    fn prepare(&self, addr: SocketAddr) -> BoxFuture<'static, ()> {
        let _ = addr;
        Box::pin(async {})
    }

    /// Closes this transport's connection to `addr`, if it keeps one: the next call opens a
    /// new one. For a caller whose request timed out there and which must not let the peer
    /// go on treating the connection as it did (a manager replica answers reads locally on a
    /// connection it has ordered a request on: after a client's failover away from it and
    /// back, its reads must be ordered again). Calls in flight on the old connection finish.
    fn reset(&self, addr: SocketAddr) -> BoxFuture<'static, ()> {
        let _ = addr;
        Box::pin(async {})
    }
}

/// Send a typed request and decode a typed answer.
/// Authenticates `stream`, a fresh TCP connection to `addr`, with `credential`, as every
/// transport does before its first frame: for tools that write frames themselves (the attack
/// benchmark, tests).
pub async fn authenticate(
    stream: &mut tokio::net::TcpStream,
    addr: SocketAddr,
    credential: &Credential,
) -> Result<(), TransportError> {
    handshake::connect(stream, addr, Some(credential), None)
        .await
        .map(|_| ())
}

pub async fn call<Req: Serialize, Resp: DeserializeOwned>(
    transport: &dyn Transport,
    addr: SocketAddr,
    request: &Req,
    payload: Bytes,
) -> Result<(Resp, Bytes), TransportError> {
    call_expecting(transport, addr, request, payload, None).await
}

/// [`call`] with the size of the answer frame, if known ([`Transport::call_expecting`]).
pub async fn call_expecting<Req: Serialize, Resp: DeserializeOwned>(
    transport: &dyn Transport,
    addr: SocketAddr,
    request: &Req,
    payload: Bytes,
    reply_bytes: Option<usize>,
) -> Result<(Resp, Bytes), TransportError> {
    let message = Bytes::from(tessera_wire::encode_message(request));
    let reply = transport
        .call_expecting(addr, message, payload, reply_bytes)
        .await?;
    let response = tessera_wire::decode_message(&reply.message)
        .map_err(|error| TransportError::Protocol { addr, error })?;
    Ok((response, reply.payload))
}

/// What a daemon does with the requests that reach it.
pub trait FrameHandler: Send + Sync + 'static {
    /// Answer one request from connection `connection`. `None` means the request was not
    /// understood: the connection is dropped and the daemon goes on serving the others.
    fn handle(
        &self,
        connection: ConnectionId,
        message: Bytes,
        payload: Bytes,
    ) -> BoxFuture<'static, Option<(Bytes, Bytes)>>;

    /// Answer a request at once on the transport's own thread, if that needs no waiting (no
    /// disk, no contended lock): `Some(answer)`, where the answer is as from
    /// [`handle`](Self::handle). `None` sends the request to `handle` on the runtime. The
    /// datagram transport asks this first, which saves the hand-offs between threads that
    /// otherwise cost more than a small read from the page cache.
    fn handle_now(
        &self,
        connection: ConnectionId,
        message: &Bytes,
        payload: &Bytes,
    ) -> Option<Option<(Bytes, Bytes)>> {
        let _ = (connection, message, payload);
        None
    }

    /// How many bytes the answer to `message` may take, header included, as far as the
    /// handler can tell without handling it (a read's length, say). A TCP server reserves
    /// them from its frame budget before handling the request and holds them until the
    /// answer is written (see [`limits`]). The default, 0, reserves an answer's bytes once it
    /// is computed.
    fn answer_bytes_hint(&self, message: &Bytes) -> usize {
        let _ = message;
        0
    }

    /// The key `claim` must prove at this daemon, if it accepts the claim at all. The
    /// default accepts no one.
    fn peer_key(&self, claim: &Claim) -> Option<Key> {
        let _ = claim;
        None
    }

    /// Bring the keys [`peer_key`](Self::peer_key) knows up to date (a key may have been
    /// issued since they were fetched); `true` if they may have changed. Asked once per
    /// handshake whose claim is unknown; the default knows no other source.
    fn refresh_keys(&self) -> BoxFuture<'static, bool> {
        Box::pin(async { false })
    }

    /// A handshake keyed datagram session `session` with `key` (called before the peer is
    /// welcomed, so before its first datagram can arrive). The default drops it.
    fn datagram_keyed(&self, session: u64, key: Key) {
        let _ = (session, key);
    }

    /// The key of datagram session `session`, if a handshake keyed it here
    /// ([`datagram_keyed`](Self::datagram_keyed)); asked once, when its first datagram
    /// arrives. The default knows none.
    fn datagram_key(&self, session: u64) -> Option<Key> {
        let _ = session;
        None
    }

    /// Connection `connection` was authenticated as `accepted.claim`; called before any of its
    /// requests reaches [`handle`](Self::handle).
    fn opened(&self, connection: ConnectionId, accepted: &Accepted) {
        let _ = (connection, accepted);
    }

    /// Connection `connection` is gone; release whatever it held.
    fn closed(&self, connection: ConnectionId) {
        let _ = connection;
    }
}
