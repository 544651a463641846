use super::*;
use proptest::prelude::*;

fn secret(byte: u8) -> Secret {
    Secret::from_bytes([byte; KEY_BYTES])
}

#[test]
fn derived_keys_differ_by_role_and_secret() {
    let a = secret(1);
    assert_ne!(a.admin_key(), a.server_key());
    assert_ne!(a.admin_key(), secret(2).admin_key());
    assert_ne!(a.admin_key(), a.admin_key().storage_key());
    assert_eq!(a.server_key(), secret(1).server_key());
}

#[test]
fn secret_file_round_trips_and_refuses_garbage() {
    let s = secret(7);
    assert_eq!(Secret::from_file_text(&s.to_file_text()), Ok(s));
    assert_eq!(
        Secret::from_file_text("hello\n00"),
        Err(AuthError::SecretHeader)
    );
    let short = format!("{SECRET_FILE_HEADER}\nabcd\n");
    assert!(matches!(
        Secret::from_file_text(&short),
        Err(AuthError::Hex { .. })
    ));
}

#[test]
fn access_key_text_round_trips() {
    let key = Key([9; KEY_BYTES]);
    let text = format_access_key(KeyId(0x0123_4567_89ab_cdef), &key);
    assert_eq!(&text[..17], "k0123456789abcdef");
    let credential = parse_access_key(&text).unwrap();
    assert_eq!(
        credential.claim,
        Claim::Client(KeyId(0x0123_4567_89ab_cdef))
    );
    assert_eq!(credential.key, key);
    assert_eq!(parse_access_key("k00:zz"), Err(AuthError::AccessKey));
    assert_eq!(parse_access_key("nothing"), Err(AuthError::AccessKey));
}

#[test]
fn debug_never_prints_key_bytes() {
    assert_eq!(format!("{:?}", Key([0xab; KEY_BYTES])), "Key(..)");
    assert_eq!(format!("{:?}", secret(0xab)), "Secret(..)");
}

proptest! {
    /// A proof verifies only for the same key, side, claim and nonces: any one changed and it
    /// does not.
    #[test]
    fn proof_binds_key_side_claim_and_nonces(
        key in any::<[u8; 32]>(), other in any::<[u8; 32]>(),
        c in any::<[u8; 32]>(), a in any::<[u8; 32]>(), id in any::<u64>(), flip in 0usize..32,
    ) {
        prop_assume!(key != other);
        let key = Key(key);
        let claim = Claim::Client(KeyId(id));
        let p = proof(&key, Side::Connecting, &claim, &c, &a);
        prop_assert!(p.verify(&proof(&key, Side::Connecting, &claim, &c, &a)));
        prop_assert!(!p.verify(&proof(&Key(other), Side::Connecting, &claim, &c, &a)));
        prop_assert!(!p.verify(&proof(&key, Side::Accepting, &claim, &c, &a)));
        prop_assert!(!p.verify(&proof(&key, Side::Connecting, &Claim::Server, &c, &a)));
        let mut c2 = c;
        c2[flip] ^= 1;
        prop_assert!(!p.verify(&proof(&key, Side::Connecting, &claim, &c2, &a)));
        prop_assert!(!p.verify(&proof(&key, Side::Connecting, &claim, &a, &c)) || a == c);
    }

    /// A datagram's tag changes with any flipped bit and with the key.
    #[test]
    fn packet_tag_detects_any_bit_flip(
        bytes in proptest::collection::vec(any::<u8>(), 1..2000), bit in any::<usize>(),
        key in any::<[u8; 32]>(),
    ) {
        let key = Key(key);
        let tag = packet_tag(&key, &bytes);
        let mut flipped = bytes.clone();
        let bit = bit % (bytes.len() * 8);
        flipped[bit / 8] ^= 1 << (bit % 8);
        prop_assert_ne!(tag, packet_tag(&key, &flipped));
        prop_assert_ne!(tag, packet_tag(&key.storage_key(), &bytes));
    }
}
