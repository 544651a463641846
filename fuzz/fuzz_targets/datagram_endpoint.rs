//! A client and a server with a live session, while strangers send either of them arbitrary
//! datagrams (as received, or with a valid checksum and MAC under the public key of these
//! unauthenticated sessions written in, so that they reach the session logic), in the crate's
//! simulated network. Nothing may panic, and afterwards the
//! session must still carry a message: garbage is dropped and the endpoint keeps serving
//! its peers.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;
use std::rc::Rc;
use tessera_datagram::sim::{addr, Sim, TraceKind};
use tessera_datagram::{packet, Config, Event, SessionId, HEADER_LEN};

/// Datagrams the two sent each other, kept as material for strangers to mutate.
const CAPTURED_MAX: usize = 8;

/// Sends `message` from the client on `session` and runs the network until the server
/// delivers a message from the client; returns it, or `None` if none came.
fn send_and_deliver(sim: &mut Sim, session: SessionId, message: &'static [u8]) -> Option<Bytes> {
    let (client, server) = (addr(1), addr(2));
    let now = sim.now();
    sim.endpoint(client)
        .send(session, Bytes::from_static(message), now)
        .expect("the session is live");
    let mut delivered = None;
    let deadline = sim.now() + 10_000_000;
    let _ = sim.run_until(deadline, |sim| {
        while let Some(event) = sim.endpoint(server).poll_event() {
            if let Event::Message { peer, message, .. } = event {
                if peer == client && delivered.is_none() {
                    delivered = Some(message);
                }
            }
        }
        while sim.endpoint(client).poll_event().is_some() {}
        delivered.is_some()
    });
    delivered
}

fuzz_target!(|data: &[u8]| {
    let (client, server) = (addr(1), addr(2));
    let mut sim = Sim::new(1);
    sim.add_endpoint(client, Config::default());
    sim.add_endpoint(server, Config::default());
    let captured = Rc::new(RefCell::new(Vec::<Vec<u8>>::new()));
    let keep = captured.clone();
    sim.set_tracer(move |event| {
        let mut keep = keep.borrow_mut();
        if event.kind == TraceKind::Sent && keep.len() < CAPTURED_MAX {
            keep.push(event.contents.to_vec());
        }
    });
    let session = sim.endpoint(client).connect(server, 0);
    let first = send_and_deliver(&mut sim, session, b"before");
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
        let copied = {
            let captured = captured.borrow();
            (options & 0x10 != 0 && !captured.is_empty())
                .then(|| captured[(options >> 5) as usize % captured.len()].clone())
        };
        let mut datagram = match copied {
            Some(mut copy) => {
                for (byte, flip) in copy.iter_mut().zip(bytes) {
                    *byte ^= flip;
                }
                copy
            }
            None => bytes.to_vec(),
        };
        if options & 1 == 1 && datagram.len() >= HEADER_LEN {
            packet::seal(&mut datagram);
        }
        let stranger = addr(10 + ((options >> 2) & 3));
        let to = if options & 2 == 2 { server } else { client };
        sim.inject(stranger, to, datagram);
        sim.run_for(10);
        while sim.endpoint(server).poll_event().is_some() {}
        while sim.endpoint(client).poll_event().is_some() {}
    }

    let after = send_and_deliver(&mut sim, session, b"after");
    assert_eq!(after.as_deref(), Some(&b"after"[..]));
});
