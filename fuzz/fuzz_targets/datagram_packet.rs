//! The datagram packet decoder on arbitrary bytes, as received and with a valid checksum and
//! public-key MAC written in (so that the fuzzer gets past them to the field checks). It must
//! never panic, and what it accepts must encode back to the same bytes (the MAC too, exactly
//! when it verifies): one packet, one encoding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_datagram::packet::{self, HEADER_LEN, PUBLIC_KEY, TAG_LEN};

fn check(datagram: &[u8]) {
    if let Ok(packet) = packet::decode(datagram) {
        let encoded = packet.encode();
        let body = datagram.len() - TAG_LEN;
        assert_eq!(encoded[..body], datagram[..body], "{packet:?}");
        assert_eq!(encoded == datagram, packet::verify(datagram, &PUBLIC_KEY));
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
