//! A client and a server with a live session, while strangers send either of them arbitrary
//! datagrams (as received, or with a valid checksum written in so that they reach the
//! session logic). Nothing may panic, and afterwards the session must still carry a message:
//! garbage is dropped and the endpoint keeps serving its peers.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use std::net::SocketAddr;
use tessera_datagram::{packet, Config, Endpoint, Event, Micros, SessionId, HEADER_LEN};

fn addr(host: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, host], 7000))
}

const CLIENT: u8 = 1;
const SERVER: u8 = 2;

/// Datagrams the two sent each other, kept as material for strangers to mutate.
const CAPTURED_MAX: usize = 8;

/// Moves what each of the two has to send to the other; what goes to strangers is lost.
fn exchange(
    client: &mut Endpoint,
    server: &mut Endpoint,
    now: Micros,
    captured: &mut Vec<Vec<u8>>,
) {
    let mut keep = |contents: &[u8]| {
        if captured.len() < CAPTURED_MAX {
            captured.push(contents.to_vec());
        }
    };
    while let Some(transmit) = client.poll_transmit(now) {
        if transmit.destination == addr(SERVER) {
            keep(&transmit.contents);
            server.handle_datagram(addr(CLIENT), &transmit.contents, now);
        }
    }
    while let Some(transmit) = server.poll_transmit(now) {
        if transmit.destination == addr(CLIENT) {
            keep(&transmit.contents);
            client.handle_datagram(addr(SERVER), &transmit.contents, now);
        }
    }
}

/// Sends `message` from the client on `session` and runs both (timers included) until the
/// server delivers a message from the client; returns it, or `None` if none came.
fn send_and_deliver(
    client: &mut Endpoint,
    server: &mut Endpoint,
    session: SessionId,
    message: &'static [u8],
    now: &mut Micros,
    captured: &mut Vec<Vec<u8>>,
) -> Option<Bytes> {
    client
        .send(session, Bytes::from_static(message), *now)
        .expect("the session is live");
    for _ in 0..10_000 {
        exchange(client, server, *now, captured);
        while let Some(event) = server.poll_event() {
            if let Event::Message { peer, message, .. } = event {
                if peer == addr(CLIENT) {
                    return Some(message);
                }
            }
        }
        while client.poll_event().is_some() {}
        let next = [client.poll_timeout(), server.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(*now + 50);
        *now = next.max(*now + 1);
        client.handle_timeout(*now);
        server.handle_timeout(*now);
    }
    None
}

fuzz_target!(|data: &[u8]| {
    let mut client = Endpoint::new(Config::default(), 1);
    let mut server = Endpoint::new(Config::default(), 2);
    let mut now: Micros = 1_000;
    let session = client.connect(addr(SERVER), now);
    let mut captured = Vec::new();
    let first = send_and_deliver(
        &mut client,
        &mut server,
        session,
        b"before",
        &mut now,
        &mut captured,
    );
    assert_eq!(first.as_deref(), Some(&b"before"[..]));

    // Each datagram: a byte of options (bit 0: seal it; bit 1: to the server, else to the
    // client; bits 2-3: which of four strangers sends it; bit 4: the bytes are not the
    // datagram but flipped into a copy of one the two sent each other, chosen by bits 5-7),
    // a byte of length, then the bytes.
    let mut rest = data;
    while let [options, len, tail @ ..] = rest {
        let len = (*len as usize).min(tail.len());
        let (bytes, after) = tail.split_at(len);
        rest = after;
        let mut datagram = if options & 0x10 != 0 && !captured.is_empty() {
            let mut copy = captured[(options >> 5) as usize % captured.len()].clone();
            for (byte, flip) in copy.iter_mut().zip(bytes) {
                *byte ^= flip;
            }
            copy
        } else {
            bytes.to_vec()
        };
        if options & 1 == 1 && datagram.len() >= HEADER_LEN {
            packet::seal(&mut datagram);
        }
        let stranger = addr(10 + ((options >> 2) & 3));
        if options & 2 == 2 {
            server.handle_datagram(stranger, &datagram, now);
        } else {
            client.handle_datagram(stranger, &datagram, now);
        }
        now += 10;
        exchange(&mut client, &mut server, now, &mut captured);
        while server.poll_event().is_some() {}
        while client.poll_event().is_some() {}
    }

    let after = send_and_deliver(
        &mut client,
        &mut server,
        session,
        b"after",
        &mut now,
        &mut captured,
    );
    assert_eq!(after.as_deref(), Some(&b"after"[..]));
});
