//! The datagram packet decoder on arbitrary bytes, as received and with a valid checksum
//! written in (so that the fuzzer gets past the CRC to the field checks). It must never
//! panic, and what it accepts must encode back to the same bytes: one packet, one encoding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_datagram::packet::{self, HEADER_LEN};

fn check(datagram: &[u8]) {
    if let Ok(packet) = packet::decode(datagram) {
        assert_eq!(packet.encode(), datagram, "{packet:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= HEADER_LEN {
        let mut sealed = data.to_vec();
        packet::seal(&mut sealed);
        check(&sealed);
    }
});
