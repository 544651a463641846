//! The datagram packet decoder on arbitrary bytes, as received and with a valid public-key MAC
//! written in (so that the endpoint would get past it to the field checks). It must
//! never panic, and what it accepts must encode back to the same bytes (the MAC too, exactly
//! when it verifies): one packet, one encoding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_datagram::packet::{self, HEADER_LEN, TAG_LEN};

fn check(datagram: &[u8]) {
    let decoded = packet::decode(datagram);
    // The UDP driver's decoder, which slices the payload instead of copying it, agrees.
    assert_eq!(
        packet::decode_bytes(&bytes::Bytes::copy_from_slice(datagram)),
        decoded
    );
    if let Ok(packet) = decoded {
        let encoded = packet.encode();
        let body = datagram.len() - TAG_LEN;
        assert_eq!(encoded[..body], datagram[..body], "{packet:?}");
        assert_eq!(encoded == datagram, packet::verify(datagram, packet::public_mac()));
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
