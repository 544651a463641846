//! The handshake that opens every TCP connection, on both ends (see `tessera_wire::Handshake`
//! for the exchange and `tessera_auth` for the proofs). The connecting side proves its
//! credential and checks that the accepting side holds the same key; the accepting side looks
//! the claimed key up through its [`FrameHandler`] and refuses, with a typed [`Refusal`], a
//! peer it cannot authenticate. Nothing else is read on a connection before it succeeds.

use crate::{FrameHandler, TransportError};
use bytes::Bytes;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tessera_auth::{proof, Claim, Credential, Key, Nonce, Refusal, Side, HANDSHAKE_VERSION};
use tessera_wire::{
    decode_message, encode_message, FrameHeader, FrameKind, Handshake, FRAME_HEADER_BYTES,
    HANDSHAKE_MESSAGE_BYTES_MAX,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A peer has this long to complete the handshake: an idle or slow stranger does not hold a
/// connection for longer.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// An authenticated peer, as the accepting side knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// Who it proved to be.
    pub claim: Claim,
    /// The datagram session it keyed, if it set one up: its id and key.
    pub datagram: Option<(u64, Key)>,
    /// The peer's IP address (`None` if the socket could not tell): the host whose link its
    /// traffic crosses, for admission control (issue 18).
    pub peer: Option<IpAddr>,
}

/// The connecting side: prove `credential` (or present none, and be refused) and check the
/// accepting side's proof. Returns both nonces, from which a datagram session's key is derived.
pub(crate) async fn connect(
    stream: &mut TcpStream,
    addr: SocketAddr,
    credential: Option<&Credential>,
    datagram_session: Option<u64>,
) -> Result<(Nonce, Nonce), TransportError> {
    let exchange = async {
        let nonce: Nonce = rand::random();
        let hello = Handshake::Hello {
            version: HANDSHAKE_VERSION,
            claim: credential.map(|c| c.claim),
            nonce,
            datagram_session,
        };
        write_step(stream, FrameKind::Request, &hello).await?;
        let (accepting, proof_a) = match read_step(stream, FrameKind::Response).await? {
            Handshake::Challenge { nonce, proof } => (nonce, proof),
            Handshake::Refused(refusal) => return Err(Step::Refused(refusal)),
            other => {
                return Err(Step::Violation(format!(
                    "expected a challenge, got {other:?}"
                )))
            }
        };
        let Some(credential) = credential else {
            return Err(Step::Violation("challenged without a credential".into()));
        };
        let (key, claim) = (&credential.key, &credential.claim);
        if !proof_a.verify(&proof(key, Side::Accepting, claim, &nonce, &accepting)) {
            return Err(Step::NotAuthentic);
        }
        let proof_c = proof(key, Side::Connecting, claim, &nonce, &accepting);
        write_step(
            stream,
            FrameKind::Request,
            &Handshake::Proof { proof: proof_c },
        )
        .await?;
        match read_step(stream, FrameKind::Response).await? {
            Handshake::Welcome => Ok((nonce, accepting)),
            Handshake::Refused(refusal) => Err(Step::Refused(refusal)),
            other => Err(Step::Violation(format!("expected welcome, got {other:?}"))),
        }
    };
    let outcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange)
        .await
        .unwrap_or(Err(Step::Violation("handshake timed out".into())));
    outcome.map_err(|step| match step {
        Step::Refused(refusal) => TransportError::Refused { addr, refusal },
        Step::NotAuthentic => TransportError::NotAuthentic { addr },
        Step::Violation(detail) => TransportError::Disconnected {
            addr,
            detail: format!("handshake failed: {detail}"),
        },
    })
}

/// The accepting side: authenticate the peer against the keys `handler` knows, or refuse it
/// (telling it why when the exchange got that far) and return `None`.
pub(crate) async fn accept(stream: &mut TcpStream, handler: &dyn FrameHandler) -> Option<Accepted> {
    let outcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, accept_steps(stream, handler))
        .await
        .unwrap_or(Err(Step::Violation("handshake timed out".into())));
    match outcome {
        Ok(accepted) => Some(accepted),
        Err(step) => {
            let refusal = match step {
                Step::Refused(refusal) => refusal,
                Step::NotAuthentic => Refusal::Protocol("not authentic".into()),
                Step::Violation(detail) => Refusal::Protocol(detail),
            };
            tracing::info!("refusing {:?}: {refusal}", stream.peer_addr().ok());
            let refused = Handshake::Refused(refusal);
            let _ = tokio::time::timeout(
                Duration::from_secs(1),
                write_step(stream, FrameKind::Response, &refused),
            )
            .await;
            None
        }
    }
}

async fn accept_steps(
    stream: &mut TcpStream,
    handler: &dyn FrameHandler,
) -> Result<Accepted, Step> {
    // A first frame that is no Hello is a request from a peer that did not authenticate.
    let hello = read_step(stream, FrameKind::Request)
        .await
        .map_err(|step| match step {
            Step::Violation(_) => Step::Refused(Refusal::Unauthenticated),
            other => other,
        })?;
    let (claim, nonce, datagram) = match hello {
        Handshake::Hello {
            version: HANDSHAKE_VERSION,
            claim,
            nonce,
            datagram_session,
        } => (claim, nonce, datagram_session),
        Handshake::Hello { version, .. } => return Err(Step::Refused(Refusal::Version(version))),
        _ => return Err(Step::Refused(Refusal::Unauthenticated)),
    };
    let claim = claim.ok_or(Step::Refused(Refusal::Unauthenticated))?;
    let key = match handler.peer_key(&claim) {
        Some(key) => Some(key),
        // A key issued a moment ago may not have reached this daemon yet: ask once more.
        None if handler.refresh_keys().await => handler.peer_key(&claim),
        None => None,
    };
    let key = key.ok_or(Step::Refused(Refusal::UnknownKey(claim)))?;
    let accepting: Nonce = rand::random();
    let proof_a = proof(&key, Side::Accepting, &claim, &nonce, &accepting);
    let challenge = Handshake::Challenge {
        nonce: accepting,
        proof: proof_a,
    };
    write_step(stream, FrameKind::Response, &challenge).await?;
    let proof_c = match read_step(stream, FrameKind::Request).await? {
        Handshake::Proof { proof } => proof,
        other => return Err(Step::Violation(format!("expected a proof, got {other:?}"))),
    };
    if !proof_c.verify(&proof(&key, Side::Connecting, &claim, &nonce, &accepting)) {
        return Err(Step::Refused(Refusal::BadProof(claim)));
    }
    let datagram = datagram.map(|session| {
        let key = tessera_auth::session_key(&key, session, &nonce, &accepting);
        (session, key)
    });
    // Before the welcome: the peer's first datagram may follow it at once.
    if let Some((session, key)) = datagram {
        handler.datagram_keyed(session, key);
    }
    write_step(stream, FrameKind::Response, &Handshake::Welcome).await?;
    let peer = stream.peer_addr().ok().map(|addr| addr.ip().to_canonical());
    Ok(Accepted {
        claim,
        datagram,
        peer,
    })
}

/// How a handshake went wrong.
enum Step {
    /// The peer refused us, or we refuse it.
    Refused(Refusal),
    /// The accepting side could not prove the key: not a daemon of this cluster.
    NotAuthentic,
    /// Broken bytes, a closed socket or a message out of turn.
    Violation(String),
}

impl From<std::io::Error> for Step {
    fn from(e: std::io::Error) -> Step {
        Step::Violation(e.to_string())
    }
}

async fn write_step(stream: &mut TcpStream, kind: FrameKind, step: &Handshake) -> Result<(), Step> {
    let message = encode_message(step);
    assert!(message.len() <= HANDSHAKE_MESSAGE_BYTES_MAX as usize);
    let header = FrameHeader {
        kind,
        message_len: message.len() as u32,
        payload_len: 0,
        request_id: 0,
    };
    let mut frame = Vec::with_capacity(FRAME_HEADER_BYTES + message.len());
    frame.extend_from_slice(&header.encode());
    frame.extend_from_slice(&message);
    stream.write_all(&frame).await?;
    Ok(())
}

async fn read_step(stream: &mut TcpStream, kind: FrameKind) -> Result<Handshake, Step> {
    let mut head = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut head).await?;
    let header = FrameHeader::decode(&head).map_err(|e| Step::Violation(e.to_string()))?;
    if header.kind != kind
        || header.payload_len != 0
        || header.message_len > HANDSHAKE_MESSAGE_BYTES_MAX
    {
        // A request before the handshake (a peer that speaks none) is refused as such.
        return Err(Step::Refused(Refusal::Unauthenticated));
    }
    let mut message = vec![0u8; header.message_len as usize];
    stream.read_exact(&mut message).await?;
    decode_message(&Bytes::from(message)).map_err(|e| Step::Violation(e.to_string()))
}
