//! The transports' frame decoders (copying and slicing) and the message decoders on arbitrary bytes. They must
//! never panic; a frame they accept must encode back to the bytes it came from, and a
//! message they accept must survive a round trip through its encoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde::{de::DeserializeOwned, Serialize};
use tessera_wire::{
    decode_message, encode_message, Frame, ManagerRequest, ManagerResponse, StorageCall,
    StorageResponse,
};

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(bytes: &[u8]) {
    if let Ok(message) = decode_message::<T>(bytes) {
        let again: T = decode_message(&encode_message(&message)).expect("re-encoded message");
        assert_eq!(again, message);
    }
}

fuzz_target!(|data: &[u8]| {
    let decoded = Frame::decode(data);
    if let Ok(Some((frame, used))) = &decoded {
        assert_eq!(frame.to_bytes(), &data[..*used]);
    }
    // The datagram transport's decoder, which slices instead of copying, agrees.
    assert_eq!(Frame::decode_bytes(&bytes::Bytes::copy_from_slice(data)), decoded);
    round_trip::<StorageCall>(data);
    round_trip::<StorageResponse>(data);
    round_trip::<ManagerRequest>(data);
    round_trip::<ManagerResponse>(data);
});
