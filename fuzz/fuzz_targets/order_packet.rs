//! The total-order packet decoder on arbitrary bytes, as received and with a valid checksum
//! written in (so that the fuzzer gets past the CRC to the field checks). It must never
//! panic, and what it accepts must encode back to the same bytes: one packet, one encoding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_order::packet::{self, HEADER_LEN};

fn check(bytes: &[u8]) {
    if let Ok(packet) = packet::decode(bytes) {
        assert_eq!(packet.encode(), bytes, "{packet:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= HEADER_LEN {
        let mut sealed = data.to_vec();
        // A consistent length, so that the body is parsed rather than refused at once.
        let body_len = (sealed.len() - HEADER_LEN) as u32;
        sealed[24..28].copy_from_slice(&body_len.to_be_bytes());
        packet::seal(&mut sealed);
        check(&sealed);
    }
});
