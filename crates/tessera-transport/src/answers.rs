//! A TCP server's answers on their way out: each holds its share of the frame budget, its
//! request's place among the connection's requests in progress, until it is written, and
//! a peer that does not take its answers is cut off (see [`crate::limits::AnswerBudget`]).

use crate::limits::{AnswerBudget, RequestGuard, Reservation, TcpLimits};
use bytes::Bytes;
use std::time::Duration;
use tessera_wire::FrameHeader;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{mpsc, OwnedSemaphorePermit};

/// Bytes written between two reports of progress: a peer that reads slowly but steadily is
/// not taken for one that stopped.
const PROGRESS_CHUNK_BYTES: usize = 64 << 10;

/// An answer computed and not yet written.
pub(crate) struct Answer {
    pub header: FrameHeader,
    pub message: Bytes,
    pub payload: Bytes,
    /// What the answer holds until it is written or dropped.
    pub held: Held,
}

/// The budget, the request's permit and its place in the connection's count of requests.
#[expect(
    dead_code,
    reason = "the fields are held for what dropping them releases"
)]
pub(crate) struct Held {
    pub budget: AnswerBudget,
    pub reservation: Reservation,
    pub permit: OwnedSemaphorePermit,
    pub request: RequestGuard,
    pub bytes: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.written(self.bytes);
    }
}

/// The bytes an answer of `message` and `payload` costs in the budget.
pub(crate) fn answer_bytes(message: &Bytes, payload: &Bytes) -> usize {
    tessera_wire::FRAME_HEADER_BYTES + message.len() + payload.len()
}

/// Write the connection's answers in the order they are queued, small ones batched into one
/// flush. Each must be taken by the peer within the time a frame of its length may take
/// ([`TcpLimits::body_timeout`]); otherwise the connection is closed and every answer still
/// queued is dropped with what it holds.
pub(crate) async fn write_answers(
    write: OwnedWriteHalf,
    mut rx: mpsc::Receiver<Answer>,
    limits: TcpLimits,
) {
    let mut out = BufWriter::with_capacity(crate::tcp::STREAM_BUFFER_BYTES, write);
    while let Some(mut answer) = rx.recv().await {
        loop {
            let timeout = limits.body_timeout(answer.held.bytes);
            if !within(timeout, write_answer(&mut out, &answer)).await {
                return;
            }
            drop(answer);
            match rx.try_recv() {
                Ok(next) => answer = next,
                Err(_) => break,
            }
        }
        if !within(limits.body_timeout(0), out.flush()).await {
            return;
        }
    }
}

/// Whether `write` completed within `timeout` (a peer that stops reading is logged).
async fn within(
    timeout: Duration,
    write: impl std::future::Future<Output = std::io::Result<()>>,
) -> bool {
    match tokio::time::timeout(timeout, write).await {
        Ok(result) => result.is_ok(),
        Err(_) => {
            tracing::info!("closing a connection whose peer took no answer for {timeout:?}");
            false
        }
    }
}

async fn write_answer(out: &mut BufWriter<OwnedWriteHalf>, answer: &Answer) -> std::io::Result<()> {
    out.write_all(&answer.header.encode()).await?;
    out.write_all(&answer.message).await?;
    for chunk in answer.payload.chunks(PROGRESS_CHUNK_BYTES) {
        out.write_all(chunk).await?;
        answer.held.budget.progressed();
    }
    Ok(())
}
