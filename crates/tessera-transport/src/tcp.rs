//! TCP: one multiplexed connection per peer, length-delimited frames, pipelined requests.

use crate::answers::{answer_bytes, write_answers, Answer, Held};
use crate::frame_buffer::FrameBuffer;
use crate::limits::{AnswerBudget, Limiter, RequestGuard, Reservation, Slot, TcpLimits};
use crate::{BoxFuture, ConnectionId, FrameHandler, Reply, TransportError};
use bytes::Bytes;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera_wire::{FrameHeader, FrameKind, FRAME_HEADER_BYTES};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

/// Socket buffer used on both ends; large enough to keep a loopback or LAN path full.
const SOCKET_BUFFER_BYTES: usize = 4 << 20;
/// User-space buffering around the socket.
pub(crate) const STREAM_BUFFER_BYTES: usize = 256 << 10;
/// User-space read buffering of a server's connection: small, since every connection of the
/// thousand a server admits may fill it, outside the frame budget.
const SERVER_READ_BUFFER_BYTES: usize = 64 << 10;
/// A frame's buffer starts at most this large and doubles as its bytes arrive.
const FRAME_BUFFER_BYTES_MIN: usize = 64 << 10;
/// Frames of at least this many bytes are received into pages mapped for them alone.
const MAPPED_FRAME_BYTES_MIN: usize = 256 << 10;
/// The unit in which the system maps memory.
const PAGE_BYTES: usize = 4096;
/// Frames queued for the writer of one connection.
const OUTBOUND_FRAMES_MAX: usize = 256;
/// Requests one connection may have in progress at a server at once.
const REQUESTS_IN_PROGRESS_MAX: usize = 256;
/// Once a frame's header has arrived at a client, the rest must follow within this time
/// (servers follow their [`TcpLimits`]).
const FRAME_BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// Timeouts of the TCP transport.
#[derive(Debug, Clone, Copy)]
pub struct TcpConfig {
    /// How long to wait for a connection to be accepted.
    pub connect_timeout: Duration,
    /// How long to wait for an answer.
    pub request_timeout: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
        }
    }
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Reply, TransportError>>>>>;

struct Connection {
    outbound: mpsc::Sender<(FrameHeader, Bytes, Bytes)>,
    pending: Pending,
    broken: Arc<std::sync::atomic::AtomicBool>,
}

/// The client side of TCP: one pipelined connection per peer, made on first use and remade
/// after it breaks.
pub struct TcpTransport {
    config: TcpConfig,
    /// What this client proves at every connection's handshake; `None` is refused.
    credential: Option<tessera_auth::Credential>,
    next_request_id: AtomicU64,
    connections: tokio::sync::Mutex<HashMap<SocketAddr, Arc<Connection>>>,
}

impl TcpTransport {
    /// A transport with the given timeouts, presenting no credential (daemons refuse it; for
    /// tests of exactly that).
    pub fn new(config: TcpConfig) -> Self {
        Self::with_credential(config, None)
    }

    /// A transport that authenticates every connection with `credential`.
    pub fn with_credential(
        config: TcpConfig,
        credential: Option<tessera_auth::Credential>,
    ) -> Self {
        TcpTransport {
            config,
            credential,
            next_request_id: AtomicU64::new(1),
            connections: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    async fn connection(&self, addr: SocketAddr) -> Result<Arc<Connection>, TransportError> {
        let mut connections = self.connections.lock().await;
        if let Some(c) = connections.get(&addr) {
            if !c.broken.load(Ordering::Acquire) {
                return Ok(c.clone());
            }
        }
        let stream = tokio::time::timeout(self.config.connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| TransportError::Connect {
                addr,
                detail: "timed out".into(),
            })?
            .map_err(|e| TransportError::Connect {
                addr,
                detail: e.to_string(),
            })?;
        let mut stream = stream;
        tune(&stream);
        crate::handshake::connect(&mut stream, addr, self.credential.as_ref(), None).await?;
        let (read, write) = stream.into_split();
        let (outbound, rx) = mpsc::channel(OUTBOUND_FRAMES_MAX);
        let pending: Pending = Arc::default();
        let broken = Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn(write_frames(write, rx));
        tokio::spawn(read_replies(addr, read, pending.clone(), broken.clone()));
        let connection = Arc::new(Connection {
            outbound,
            pending,
            broken,
        });
        connections.insert(addr, connection.clone());
        Ok(connection)
    }

    /// A call, sent once more on a fresh connection if its connection was closed under it:
    /// a server closes connections that are idle or evicted for newcomers, and those have no
    /// request in progress there, so the request was not served (as the datagram transport
    /// sends a request once more after its server's RESET).
    async fn call_inner(
        self: Arc<Self>,
        addr: SocketAddr,
        message: Bytes,
        payload: Bytes,
    ) -> Result<Reply, TransportError> {
        match self.call_once(addr, message.clone(), payload.clone()).await {
            Err(TransportError::Disconnected { .. }) => {
                self.call_once(addr, message, payload).await
            }
            result => result,
        }
    }

    async fn call_once(
        &self,
        addr: SocketAddr,
        message: Bytes,
        payload: Bytes,
    ) -> Result<Reply, TransportError> {
        let connection = self.connection(addr).await?;
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        connection.pending.lock().unwrap().insert(request_id, tx);
        let header = FrameHeader {
            kind: FrameKind::Request,
            message_len: message.len() as u32,
            payload_len: payload.len() as u32,
            request_id,
        };
        if connection
            .outbound
            .send((header, message, payload))
            .await
            .is_err()
        {
            connection.pending.lock().unwrap().remove(&request_id);
            connection.broken.store(true, Ordering::Release);
            return Err(TransportError::Disconnected {
                addr,
                detail: "writer closed".into(),
            });
        }
        match tokio::time::timeout(self.config.request_timeout, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(TransportError::Disconnected {
                addr,
                detail: "connection closed".into(),
            }),
            Err(_) => {
                connection.pending.lock().unwrap().remove(&request_id);
                Err(TransportError::Timeout {
                    addr,
                    timeout_ms: self.config.request_timeout.as_millis() as u64,
                })
            }
        }
    }
}

/// `TcpTransport` is used through an `Arc` so that calls can outlive the borrow.
impl crate::Transport for Arc<TcpTransport> {
    fn call(
        &self,
        addr: SocketAddr,
        message: Bytes,
        payload: Bytes,
    ) -> BoxFuture<'static, Result<Reply, TransportError>> {
        Box::pin(self.clone().call_inner(addr, message, payload))
    }

    fn reset(&self, addr: SocketAddr) -> BoxFuture<'static, ()> {
        let transport = self.clone();
        Box::pin(async move {
            // Out of the map, the connection closes once the calls on it finish (its writer
            // ends with the last sender, and the peer sees the end of the stream).
            transport.connections.lock().await.remove(&addr);
        })
    }
}

fn tune(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let socket = socket2::SockRef::from(stream);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER_BYTES);
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER_BYTES);
}

/// Write queued frames, batching small ones into one flush.
async fn write_frames(write: OwnedWriteHalf, mut rx: mpsc::Receiver<(FrameHeader, Bytes, Bytes)>) {
    let mut out = BufWriter::with_capacity(STREAM_BUFFER_BYTES, write);
    while let Some(mut frame) = rx.recv().await {
        loop {
            let (header, message, payload) = frame;
            let ok = out.write_all(&header.encode()).await.is_ok()
                && out.write_all(&message).await.is_ok()
                && out.write_all(&payload).await.is_ok();
            if !ok {
                return;
            }
            match rx.try_recv() {
                Ok(next) => frame = next,
                Err(_) => break,
            }
        }
        if out.flush().await.is_err() {
            return;
        }
    }
}

/// Read one frame: `Ok(None)` on a clean end of stream between frames.
async fn read_frame(
    read: &mut BufReader<OwnedReadHalf>,
) -> Result<Option<(FrameHeader, Bytes, Bytes)>, String> {
    let mut head = [0u8; FRAME_HEADER_BYTES];
    match read.read_exact(&mut head[..1]).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.to_string()),
    }
    let body = async {
        read.read_exact(&mut head[1..])
            .await
            .map_err(|e| e.to_string())?;
        let header = FrameHeader::decode(&head).map_err(|e| e.to_string())?;
        let mut body = read_bytes(read, body_len(&header)).await?;
        let message = body.split_to(header.message_len as usize);
        Ok::<_, String>((header, message, body))
    };
    match tokio::time::timeout(FRAME_BODY_TIMEOUT, body).await {
        Ok(result) => result.map(Some),
        Err(_) => Err("truncated frame: the rest did not arrive".into()),
    }
}

fn body_len(header: &FrameHeader) -> usize {
    header.message_len as usize + header.payload_len as usize
}

/// The next size of a frame buffer of `capacity` on its way to `len`: `len` halved as often
/// as it stays above [`FRAME_BUFFER_BYTES_MIN`] and `capacity`. The sizes a buffer takes are
/// `len / 2^k`, ..., `len / 2`, `len`, so what growing it frees is less than `len`.
fn next_capacity(capacity: usize, len: usize) -> usize {
    assert!(capacity < len);
    let mut next = len;
    while next / 2 > capacity && next / 2 >= FRAME_BUFFER_BYTES_MIN {
        next /= 2;
    }
    next
}

/// Bytes of the frame budget a frame of `len` body bytes reserves: mapped buffers cost their
/// length (rounded to pages); smaller ones from the allocator twice it (the buffer, and what
/// growing it frees, which the allocator keeps).
fn frame_cost(len: usize) -> usize {
    if len >= MAPPED_FRAME_BYTES_MIN {
        len.next_multiple_of(PAGE_BYTES)
    } else {
        2 * len
    }
}

/// Read exactly `len` bytes of a frame's body at a server, into a buffer that grows (by
/// [`next_capacity`]) as they arrive: a header that announces megabytes and is followed by
/// nothing costs nothing. Each arrival counts as activity of `slot`.
async fn read_body(
    read: &mut BufReader<OwnedReadHalf>,
    len: usize,
    slot: &Slot,
) -> Result<Bytes, String> {
    if len >= MAPPED_FRAME_BYTES_MIN {
        return read_mapped(read, len, slot).await;
    }
    let mut buf: Vec<u8> = Vec::new();
    while buf.len() < len {
        if buf.len() == buf.capacity() {
            let capacity = next_capacity(buf.capacity(), len);
            buf.reserve_exact(capacity - buf.len());
        }
        let want = (len - buf.len()).min(buf.capacity() - buf.len());
        let got = (&mut *read)
            .take(want as u64)
            .read_buf(&mut buf)
            .await
            .map_err(|e| e.to_string())?;
        if got == 0 {
            return Err("connection closed inside a frame".into());
        }
        slot.touch();
    }
    Ok(Bytes::from(buf))
}

/// [`read_body`] for a large frame, into pages mapped for it alone ([`FrameBuffer`]).
async fn read_mapped(
    read: &mut BufReader<OwnedReadHalf>,
    len: usize,
    slot: &Slot,
) -> Result<Bytes, String> {
    let mut buf = FrameBuffer::new();
    while buf.len() < len {
        if buf.len() == buf.capacity() {
            let capacity = next_capacity(buf.capacity(), len).next_multiple_of(PAGE_BYTES);
            buf.grow(capacity)
                .map_err(|e| format!("cannot map a frame buffer: {e}"))?;
        }
        let want = (len - buf.len()).min(buf.capacity() - buf.len());
        let got = read
            .read(&mut buf.spare()[..want])
            .await
            .map_err(|e| e.to_string())?;
        if got == 0 {
            return Err("connection closed inside a frame".into());
        }
        buf.advance(got);
        slot.touch();
    }
    Ok(buf.into_bytes())
}

/// Read exactly `len` bytes into a fresh buffer at a client, which trusts the servers it
/// chose to ask.
async fn read_bytes(read: &mut BufReader<OwnedReadHalf>, len: usize) -> Result<Bytes, String> {
    let mut buf = Vec::with_capacity(len);
    while buf.len() < len {
        let want = (len - buf.len()) as u64;
        let got = (&mut *read)
            .take(want)
            .read_buf(&mut buf)
            .await
            .map_err(|e| e.to_string())?;
        if got == 0 {
            return Err("connection closed inside a frame".into());
        }
    }
    Ok(Bytes::from(buf))
}

async fn read_replies(
    addr: SocketAddr,
    read: OwnedReadHalf,
    pending: Pending,
    broken: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut read = BufReader::with_capacity(STREAM_BUFFER_BYTES, read);
    let detail = loop {
        match read_frame(&mut read).await {
            Ok(Some((header, message, payload))) => {
                if header.kind != FrameKind::Response {
                    break "peer sent a request on a client connection".to_string();
                }
                if let Some(tx) = pending.lock().unwrap().remove(&header.request_id) {
                    let _ = tx.send(Ok(Reply { message, payload }));
                }
            }
            Ok(None) => break "closed by peer".to_string(),
            Err(e) => break e,
        }
    };
    broken.store(true, Ordering::Release);
    for (_, tx) in pending.lock().unwrap().drain() {
        let _ = tx.send(Err(TransportError::Disconnected {
            addr,
            detail: detail.clone(),
        }));
    }
}

/// Connections the kernel completes and queues for a daemon's accept loop. Tokio's default
/// (128) overflowed while 2,000 strangers connected at once: the kernel then dropped
/// connection attempts, and each dropped one, a client's as well as the stranger's, waited
/// the 1 s of a SYN's retransmission (16 of 4,000 in one run: 2,000 connections took 7-9 s).
pub const LISTEN_BACKLOG: u32 = 4096;

/// A listener for a daemon on `addr` (SO_REUSEADDR, as `TcpListener::bind`), with a
/// backlog of [`LISTEN_BACKLOG`] (the kernel caps it at `net.core.somaxconn`).
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Serve `handler` on `listener` until the task is dropped, within the default
/// [`TcpLimits`]. See [`serve_tcp_limited`].
pub async fn serve_tcp(listener: TcpListener, handler: Arc<dyn FrameHandler>) {
    serve_tcp_limited(listener, handler, TcpLimits::default()).await
}

/// Serve `handler` on `listener` until the task is dropped. Each connection reads requests and
/// runs them concurrently (answers may go out of order); a connection that sends garbage is
/// dropped without disturbing the others. Connections, their idle time, the time a frame may
/// take and the memory frames in flight may hold are bounded by `limits` (see
/// [`crate::limits`]). Panics if `limits` are invalid ([`TcpLimits::validate`]).
pub async fn serve_tcp_limited(
    listener: TcpListener,
    handler: Arc<dyn FrameHandler>,
    limits: TcpLimits,
) {
    let limiter = Limiter::new(limits);
    let next_connection = AtomicU64::new(1);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let slot = match limiter.admit(peer.ip()) {
            Ok(slot) => slot,
            Err(refused) => {
                tracing::warn!("refusing {peer}: {refused:?} (every connection busy)");
                continue;
            }
        };
        tune(&stream);
        let id = next_connection.fetch_add(1, Ordering::Relaxed);
        let handler = handler.clone();
        tokio::spawn(async move {
            serve_connection(id, stream, handler.clone(), &slot).await;
            handler.closed(id);
            drop(slot);
        });
    }
}

/// What a server read from a connection.
enum Incoming {
    /// A whole frame, with its reservation of the frame budget.
    Frame(FrameHeader, Bytes, Bytes, Reservation),
    /// Nothing for the idle timeout.
    Idle,
    /// The peer closed the connection between frames.
    Closed,
}

/// Read one request frame within the slot's limits: its header within `header_timeout` of its
/// first byte, its length reserved from the frame budget, its body within the time its length
/// allows.
async fn read_request(
    read: &mut BufReader<OwnedReadHalf>,
    slot: &Slot,
) -> Result<Incoming, String> {
    let limits = slot.limits().clone();
    let mut head = [0u8; FRAME_HEADER_BYTES];
    // One byte: either it arrived or nothing was taken, so the timeout loses nothing.
    match tokio::time::timeout(limits.idle_timeout, read.read_exact(&mut head[..1])).await {
        Err(_) => return Ok(Incoming::Idle),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(Incoming::Closed),
        Ok(Err(e)) => return Err(e.to_string()),
        Ok(Ok(_)) => slot.touch(),
    }
    tokio::time::timeout(limits.header_timeout, read.read_exact(&mut head[1..]))
        .await
        .map_err(|_| {
            format!(
                "frame header not complete within {:?}",
                limits.header_timeout
            )
        })?
        .map_err(|e| e.to_string())?;
    let header = FrameHeader::decode(&head).map_err(|e| e.to_string())?;
    let reservation = slot.reserve(frame_cost(body_len(&header))).await;
    // The body's time starts once it may be read: waiting for the budget is the server's doing.
    let timeout = limits.body_timeout(body_len(&header));
    let mut body = tokio::time::timeout(timeout, read_body(read, body_len(&header), slot))
        .await
        .map_err(|_| format!("frame body not complete within {timeout:?}"))??;
    slot.frame_read();
    let message = body.split_to(header.message_len as usize);
    Ok(Incoming::Frame(header, message, body, reservation))
}

async fn serve_connection(
    id: ConnectionId,
    stream: TcpStream,
    handler: Arc<dyn FrameHandler>,
    slot: &Slot,
) {
    let mut stream = stream;
    // A peer still in its handshake is as evictable as an idle one.
    let accepted = tokio::select! {
        accepted = crate::handshake::accept(&mut stream, handler.as_ref()) => accepted,
        _ = slot.evicted() => None,
    };
    let Some(accepted) = accepted else {
        return;
    };
    slot.authenticated();
    handler.opened(id, &accepted);
    if accepted.datagram.is_some() {
        // The handshake keyed a datagram session: its requests come over UDP.
        return;
    }
    let peer = stream.peer_addr().ok();
    let (read, write) = stream.into_split();
    let (tx, rx) = mpsc::channel(OUTBOUND_FRAMES_MAX);
    let writer = tokio::spawn(write_answers(write, rx, slot.limits().clone()));
    let mut read = BufReader::with_capacity(SERVER_READ_BUFFER_BYTES, read);
    let in_progress = Arc::new(Semaphore::new(REQUESTS_IN_PROGRESS_MAX));
    let (violation_tx, mut violation_rx) = mpsc::channel::<()>(1);
    let budget = slot.answers();
    let mut evicted = false;
    loop {
        let incoming = tokio::select! {
            incoming = read_request(&mut read, slot) => incoming,
            _ = violation_rx.recv() => break,
            _ = tx.closed() => break,
            _ = slot.evicted() => {
                evicted = true;
                break;
            }
        };
        let (header, message, payload, reservation) = match incoming {
            Ok(Incoming::Frame(header, message, payload, reservation)) => {
                (header, message, payload, reservation)
            }
            Ok(Incoming::Idle) if slot.busy() => continue,
            Ok(Incoming::Idle) => {
                tracing::info!("closing the connection from {peer:?}: idle");
                break;
            }
            Ok(Incoming::Closed) => break,
            Err(e) => {
                tracing::info!("dropping connection from {peer:?}: {e}");
                break;
            }
        };
        if header.kind != FrameKind::Request {
            tracing::info!("dropping connection from {peer:?}: response frame on a server");
            break;
        }
        let request = slot.request();
        let Ok(permit) = in_progress.clone().acquire_owned().await else {
            break;
        };
        // The answer's bytes are reserved before it is computed, as far as the handler can
        // tell; a peer that does not read its answers then stops being read itself.
        let hint = handler
            .answer_bytes_hint(&message)
            .min(slot.limits().frame_bytes_budget - reservation.bytes());
        let answer_reservation = tokio::select! {
            reserved = budget.reserve(hint) => reserved,
            _ = slot.evicted() => {
                evicted = true;
                break;
            }
        };
        let work = Work {
            header,
            handler: handler.clone(),
            tx: tx.clone(),
            violation_tx: violation_tx.clone(),
            budget: budget.clone(),
        };
        tokio::spawn(work.answer(
            id,
            message,
            payload,
            reservation,
            answer_reservation,
            (permit, request),
        ));
    }
    drop(tx);
    if evicted {
        // Answers queued for a peer evicted for stalling are what it was evicted for.
        writer.abort();
        return;
    }
    // Let answers already computed go out before the socket closes.
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
}

/// One request on its way to the handler, and what its answer needs to be queued.
struct Work {
    header: FrameHeader,
    handler: Arc<dyn FrameHandler>,
    tx: mpsc::Sender<Answer>,
    violation_tx: mpsc::Sender<()>,
    budget: AnswerBudget,
}

impl Work {
    /// Handle the request and queue its answer, holding the budget until it is written.
    async fn answer(
        self,
        id: ConnectionId,
        message: Bytes,
        payload: Bytes,
        frame: Reservation,
        reserved: Reservation,
        (permit, request): (OwnedSemaphorePermit, RequestGuard),
    ) {
        let answer = self.handler.handle(id, message, payload).await;
        // The request's bytes are handled: they leave the budget.
        drop(frame);
        let Some((message, payload)) = answer else {
            tracing::info!("dropping a connection: request not understood");
            let _ = self.violation_tx.try_send(());
            return;
        };
        let bytes = answer_bytes(&message, &payload);
        let reservation = if bytes <= reserved.bytes() {
            reserved
        } else {
            // Larger than the handler foresaw: reserved afresh, holding nothing meanwhile,
            // so that answers waiting for the budget never hold part of it.
            drop(reserved);
            self.budget.reserve(bytes).await
        };
        self.budget.queued(bytes);
        let header = FrameHeader {
            kind: FrameKind::Response,
            message_len: message.len() as u32,
            payload_len: payload.len() as u32,
            request_id: self.header.request_id,
        };
        let held = Held {
            budget: self.budget,
            reservation,
            permit,
            request,
            bytes,
        };
        let _ = self
            .tx
            .send(Answer {
                header,
                message,
                payload,
                held,
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_buffer_grows_by_halves_of_its_length_and_frees_less_than_it() {
        for len in [
            1,
            1000,
            64 << 10,
            (64 << 10) + 1,
            1 << 20,
            (16 << 20) + 1,
            24 << 20,
        ] {
            let (mut capacity, mut freed, mut steps) = (0, 0, 0);
            while capacity < len {
                let next = next_capacity(capacity, len);
                assert!(next > capacity && next <= len);
                assert!(
                    capacity == 0 || next <= 2 * capacity + 1,
                    "{len}: {capacity} -> {next}"
                );
                freed += capacity;
                capacity = next;
                steps += 1;
            }
            assert!(freed < len.max(2), "{len}: freed {freed}");
            assert!(steps <= 10, "{len}: {steps} steps");
        }
    }
}
