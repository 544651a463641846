//! Codec tests: round trips, bounds, and garbage that must not panic.

use super::*;
use bytes::Bytes;
use proptest::prelude::*;
use tessera_layout::{OverflowRole, Region};

fn storage_request() -> impl Strategy<Value = StorageRequest> {
    prop_oneof![
        Just(StorageRequest::Ping),
        Just(StorageRequest::Sync),
        any::<u64>().prop_map(|after| StorageRequest::Records { after }),
        (any::<u64>(), any::<u64>(), ".{0,40}").prop_map(|(id, size, path)| {
            StorageRequest::Describe {
                meta: FileMeta {
                    id,
                    path,
                    layout: tessera_layout::Layout::new(tessera_layout::Scheme::Raid5, 65536, 3)
                        .unwrap(),
                    servers: vec![1, 2, 3],
                    size,
                },
                committed: size % 2 == 0,
            }
        }),
        (any::<u64>(), any::<u64>(), ".{0,40}", any::<bool>()).prop_map(
            |(id, size, path, committed)| StorageRequest::DescribeAndSync {
                meta: FileMeta {
                    id,
                    path,
                    layout: tessera_layout::Layout::new(tessera_layout::Scheme::Raid5, 65536, 5)
                        .unwrap(),
                    servers: vec![4, 0, 3, 1, 2],
                    size,
                },
                committed,
            }
        ),
        (any::<u64>(), any::<u64>(), any::<u32>(), any::<bool>()).prop_map(
            |(file, offset, len, overlay)| {
                StorageRequest::Read {
                    file,
                    region: Region::Data,
                    offset,
                    len,
                    overlay,
                }
            }
        ),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(file, offset, start)| {
            StorageRequest::Write {
                file,
                region: Region::Redundancy,
                offset,
                invalidate_overflow: start % 2 == 0,
            }
        }),
        (any::<u64>(), any::<u64>()).prop_map(|(file, offset)| {
            StorageRequest::OverflowWrite {
                file,
                role: OverflowRole::Mirror,
                offset,
            }
        }),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u32>()).prop_map(
            |(file, stripe, offset, len)| {
                StorageRequest::LockParity {
                    file,
                    stripe,
                    offset,
                    len,
                }
            }
        ),
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            prop::collection::vec((any::<u32>(), any::<u32>(), any::<u32>()), 0..4)
        )
            .prop_map(|(file, stripe, token, pieces)| {
                StorageRequest::RecordIntent {
                    file,
                    stripe,
                    token,
                    intent: ParityIntent {
                        unit_offset: file ^ stripe,
                        span_start: pieces.first().map_or(0, |p| p.0),
                        span_len: pieces.first().map_or(0, |p| p.1),
                        pieces: pieces
                            .into_iter()
                            .map(|(column, offset_in_unit, len)| IntentPiece {
                                column,
                                offset_in_unit,
                                len,
                            })
                            .collect(),
                    },
                }
            }),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<bool>()).prop_map(
            |(file, stripe, token, unlock)| StorageRequest::WriteParity {
                file,
                stripe,
                offset: token / 3,
                unlock,
                token,
            }
        ),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(file, start, end)| {
            StorageRequest::RecordStale {
                file,
                stripes: IndexRange::new(start, end),
            }
        }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(file, token)| StorageRequest::RenewStale { file, token }),
        (any::<u64>(), any::<Option<u64>>(), any::<u64>()).prop_map(|(file, token, start)| {
            StorageRequest::ClearStale {
                file,
                token,
                stripes: IndexRange::new(start, start.saturating_add(1)),
            }
        }),
    ]
}

proptest! {
    #[test]
    fn storage_requests_round_trip(request in storage_request(), incarnation in any::<u64>(), payload in prop::collection::vec(any::<u8>(), 0..3000), id in any::<u64>()) {
        let req = StorageCall { incarnation, request, service: Service::BestEffort };
        let frame = Frame::new(FrameKind::Request, id, &req, Bytes::from(payload.clone()));
        let bytes = frame.to_bytes();
        let (decoded, used) = Frame::decode(&bytes).unwrap().unwrap();
        prop_assert_eq!(used, bytes.len());
        prop_assert_eq!(Frame::decode_bytes(&Bytes::from(bytes.clone())).unwrap(), Some((decoded.clone(), used)));
        prop_assert_eq!(&decoded, &frame);
        prop_assert_eq!(decoded.decode_message::<StorageCall>().unwrap(), req);
        // Every strict prefix asks for more bytes rather than failing or inventing a frame.
        for cut in [0, 1, FRAME_HEADER_BYTES - 1, FRAME_HEADER_BYTES, bytes.len() - 1] {
            if cut < bytes.len() {
                prop_assert_eq!(Frame::decode(&bytes[..cut]).unwrap(), None);
            }
        }
    }

    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        prop_assert_eq!(Frame::decode_bytes(&Bytes::from(bytes.clone())), Frame::decode(&bytes));
        let _ = decode_message::<StorageRequest>(&bytes);
        let _ = decode_message::<StorageCall>(&bytes);
        let _ = decode_message::<StorageResponse>(&bytes);
        let _ = decode_message::<ManagerRequest>(&bytes);
        let _ = decode_message::<ManagerResponse>(&bytes);
    }

    #[test]
    fn flipped_bytes_in_a_message_never_panic(req in storage_request(), at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut bytes = encode_message(&StorageCall { incarnation: 7, request: req, service: Service::BestEffort });
        let i = at.index(bytes.len());
        bytes[i] ^= 1 << bit;
        let _ = decode_message::<StorageCall>(&bytes);
    }
}

#[test]
fn oversized_lengths_are_refused_before_allocation() {
    let mut header = FrameHeader {
        kind: FrameKind::Request,
        message_len: 4,
        payload_len: 0,
        request_id: 7,
    }
    .encode();
    header[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        Frame::decode(&header),
        Err(WireError::TooLarge {
            field: "payload",
            ..
        })
    ));
    let other = crate::PROTOCOL_VERSION.wrapping_add(1);
    header[2] = other;
    assert_eq!(Frame::decode(&header), Err(WireError::Version(other)));
    assert_eq!(
        Frame::decode(b"GET / HTTP/1.1\r\n\r\n"),
        Err(WireError::BadMagic)
    );
}

#[test]
fn trailing_bytes_after_a_message_are_refused() {
    let mut bytes = encode_message(&StorageRequest::Ping);
    bytes.push(0);
    assert!(matches!(
        decode_message::<StorageRequest>(&bytes),
        Err(WireError::Malformed(_))
    ));
}

#[test]
fn manager_messages_round_trip() {
    let req = ManagerRequest::Create {
        path: "a/b".into(),
        layout: LayoutRequest {
            scheme: tessera_layout::Scheme::Hybrid,
            stripe_unit: 65536,
            width: Some(4),
        },
        replace: true,
    };
    assert_eq!(
        decode_message::<ManagerRequest>(&encode_message(&req)).unwrap(),
        req
    );
    let resp = ManagerResponse::Error(ManagerError::NotEnoughServers { wanted: 6, up: 5 });
    assert_eq!(
        decode_message::<ManagerResponse>(&encode_message(&resp)).unwrap(),
        resp
    );
}

#[test]
fn appended_messages_round_trip_and_leave_earlier_variants_alone() {
    // Appending variants must not renumber earlier ones: the first variant still encodes as 0.
    assert_eq!(encode_message(&StorageRequest::Ping), vec![0]);
    let requests = [
        ManagerRequest::CreatePending {
            path: "a".into(),
            layout: LayoutRequest {
                scheme: tessera_layout::Scheme::Raid5,
                stripe_unit: 65536,
                width: None,
            },
        },
        ManagerRequest::RenewPending { file: u64::MAX },
        ManagerRequest::CommitPending { file: 7 },
        ManagerRequest::CommitPendingSized {
            file: 7,
            size: u64::MAX,
        },
        ManagerRequest::AbandonPending { file: 7 },
        ManagerRequest::ReplicaChange {
            id: u16::MAX,
            addr: Some("127.0.0.1:9".into()),
        },
        ManagerRequest::ReplicaChange { id: 2, addr: None },
        ManagerRequest::ReplicaGroup,
        ManagerRequest::Orphans { server: 3 },
        ManagerRequest::OrphansRemoved {
            server: 3,
            files: vec![1, 2, u64::MAX],
        },
    ];
    for req in requests {
        assert_eq!(
            decode_message::<ManagerRequest>(&encode_message(&req)).unwrap(),
            req
        );
    }
    let responses = [
        ManagerResponse::Committed { replaced: None },
        ManagerResponse::Orphans(vec![5, 6]),
        ManagerResponse::ReplicaGroup {
            epoch: u32::MAX,
            members: vec![(1, "127.0.0.1:1".into()), (u16::MAX, String::new())],
        },
        ManagerResponse::Error(ManagerError::NotPending(9)),
        ManagerResponse::Error(ManagerError::TooLarge {
            what: "size".into(),
            max: 1 << 42,
        }),
    ];
    for resp in responses {
        assert_eq!(
            decode_message::<ManagerResponse>(&encode_message(&resp)).unwrap(),
            resp
        );
    }
    let req = StorageRequest::Allocated {
        file: 1,
        region: tessera_layout::Region::Redundancy,
        offset: 0,
        len: 1 << 40,
    };
    assert_eq!(
        decode_message::<StorageRequest>(&encode_message(&req)).unwrap(),
        req
    );
    let resp = StorageResponse::Allocated {
        ranges: vec![IndexRange::new(0, 4096), IndexRange::new(1 << 39, 1 << 40)],
    };
    assert_eq!(
        decode_message::<StorageResponse>(&encode_message(&resp)).unwrap(),
        resp
    );
}

/// A version-15 peer (before mirror fences) is refused by name, never misread: its frame
/// fails with the version it spoke, and the message says which this build speaks.
#[test]
fn a_frame_of_version_15_is_refused_with_a_clear_error() {
    assert_eq!(crate::PROTOCOL_VERSION, 16);
    let mut bytes = FrameHeader {
        kind: FrameKind::Request,
        message_len: 0,
        payload_len: 0,
        request_id: 1,
    }
    .encode();
    bytes[2] = 15;
    let error = Frame::decode(&bytes).unwrap_err();
    assert_eq!(error, WireError::Version(15));
    assert_eq!(
        error.to_string(),
        "protocol version 15 is not supported (this build speaks 16)"
    );
}

/// The combined request round-trips whole, and is not the `Describe` it extends.
#[test]
fn describe_and_sync_round_trips() {
    let meta = FileMeta {
        id: 99,
        path: "a/b".into(),
        layout: tessera_layout::Layout::new(tessera_layout::Scheme::Raid5, 65536, 5).unwrap(),
        servers: vec![0, 1, 2, 3, 4],
        size: 65536,
    };
    let request = StorageRequest::DescribeAndSync {
        meta: meta.clone(),
        committed: true,
    };
    let bytes = encode_message(&request);
    assert_eq!(decode_message::<StorageRequest>(&bytes).unwrap(), request);
    let describe = StorageRequest::Describe {
        meta,
        committed: true,
    };
    assert_ne!(encode_message(&describe), bytes);
}

/// A write under a mirror fence round-trips whole, its inner request intact.
#[test]
fn a_write_under_a_mirror_fence_round_trips() {
    let req = StorageRequest::UnderMirrorFence {
        fence: u64::MAX,
        request: Box::new(StorageRequest::OverflowWrite {
            file: 7,
            role: OverflowRole::Mirror,
            offset: u64::MAX - 4095,
        }),
    };
    assert_eq!(
        decode_message::<StorageRequest>(&encode_message(&req)).unwrap(),
        req
    );
}
