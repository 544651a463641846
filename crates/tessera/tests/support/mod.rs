//! Raw TCP peers for the multi-process tests: the handshake done by hand (or not at all), so
//! that a test can send exactly the bytes it means to; and [`local`], the local cluster as
//! the manager tests drive it.

// Each test crate uses a part of it.
#![allow(dead_code)]

use bytes::Bytes;
use std::net::SocketAddr;
use tessera_auth::{proof, Credential, Nonce, Side, HANDSHAKE_VERSION};
use tessera_wire::{decode_message, Frame, FrameHeader, FrameKind, Handshake, FRAME_HEADER_BYTES};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Send one handshake step as a request frame.
pub async fn send_step(stream: &mut TcpStream, step: &Handshake) {
    let frame = Frame::new(FrameKind::Request, 0, step, Bytes::new()).to_bytes();
    stream.write_all(&frame).await.expect("send handshake step");
}

/// Read one handshake step from a response frame.
pub async fn read_step(stream: &mut TcpStream) -> Handshake {
    let mut head = [0u8; FRAME_HEADER_BYTES];
    stream
        .read_exact(&mut head)
        .await
        .expect("handshake answer");
    let header = FrameHeader::decode(&head).expect("handshake header");
    let mut body = vec![0u8; header.message_len as usize];
    stream.read_exact(&mut body).await.expect("handshake body");
    decode_message(&body).expect("handshake step decodes")
}

/// Run the handshake with `credential` on `stream`: `Ok` on `Welcome`, else the step that
/// ended it (a refusal).
pub async fn handshake(stream: &mut TcpStream, credential: &Credential) -> Result<(), Handshake> {
    let nonce: Nonce = rand::random();
    let hello = Handshake::Hello {
        version: HANDSHAKE_VERSION,
        claim: Some(credential.claim),
        nonce,
        datagram_session: None,
    };
    send_step(stream, &hello).await;
    let accepting = match read_step(stream).await {
        Handshake::Challenge { nonce, .. } => nonce,
        other => return Err(other),
    };
    let mine = proof(
        &credential.key,
        Side::Connecting,
        &credential.claim,
        &nonce,
        &accepting,
    );
    send_step(stream, &Handshake::Proof { proof: mine }).await;
    match read_step(stream).await {
        Handshake::Welcome => Ok(()),
        other => Err(other),
    }
}

/// A TCP connection to `addr`, authenticated with `credential`.
pub async fn authenticated(addr: SocketAddr, credential: &Credential) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    handshake(&mut stream, credential)
        .await
        .unwrap_or_else(|step| panic!("handshake with {addr} refused: {step:?}"));
    stream
}

pub mod local;
