//! Admission control for reserved streams (Radon, issue 18; the global knowledge the paper
//! leaves for future work).
//!
//! A stream reserves a rate on the links it crosses. [`Reservations`] admits it only if, on
//! every one of them, the rates admitted stay within the reservable share of the link's
//! capacity; otherwise it refuses at once, naming the first link that cannot carry it and the
//! rate still available there. Admitted reservations live for a lease, renewed by the stream
//! and released when it ends; a client that goes away stops renewing and its reservations
//! lapse. Time comes in as an argument; nothing here reads a clock or does I/O.
//!
//! The links are the servers' a stream's file is on and the client's own: a client's
//! streams all cross its host's link, whichever servers they use, so six reader processes
//! on one host reading from six servers meet there (the mirror case) and are
//! admitted only as far as they fit in it. The client's host is the TCP peer address of its
//! `Reserve` ([`client_link`]); its direction (in for reads, out for writes) is not known,
//! so a host reading and writing at once is counted on one link, which errs toward refusing.
//!
//! The capacities are configured ([`LinkCapacity`]): one rate for every host's link,
//! servers' and clients', given to the manager with `--link-rate`. The state is soft: it is not persisted nor
//! ordered among the replicas of a replicated manager (each replica admits on its own), and a
//! restarted manager knows no reservation (renewals then fail and the streams go on
//! unreserved).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};
use tessera_wire::{FileMeta, ManagerError, ServerId};

/// How long a reservation lives without a renewal.
pub const RESERVATION_LEASE: Duration = Duration::from_secs(10);

/// Most reservations admitted at once (a bound on what clients can make the manager hold).
pub const RESERVATIONS_MAX: usize = 65_536;

/// Bytes a full-size packet takes on an Ethernet link besides its payload: Ethernet's header
/// (14), IPv4 (20), UDP (8) and the datagram header with its tag (56, format 4).
pub const PACKET_OVERHEAD_BYTES: u64 = 14 + 20 + 8 + tessera_datagram::OVERHEAD_LEN as u64;

/// Payload of a full-size packet at an MTU of 1500 bytes (the IP packet less IPv4, UDP and
/// the datagram header): a stream's bytes go in packets of this size.
pub const PACKET_PAYLOAD_BYTES: u64 = 1500 - 20 - 8 - tessera_datagram::OVERHEAD_LEN as u64;

/// What a stream of `payload_bytes_per_s` takes of a link: its payload and the headers of
/// the full-size packets that carry it (7% more at an MTU of 1500).
pub fn wire_bytes_per_s(payload_bytes_per_s: u64) -> u64 {
    let wire =
        u128::from(payload_bytes_per_s) * u128::from(PACKET_PAYLOAD_BYTES + PACKET_OVERHEAD_BYTES);
    u64::try_from(wire.div_ceil(u128::from(PACKET_PAYLOAD_BYTES))).unwrap_or(u64::MAX)
}

/// The share of a link reservations may take unless configured, in thousandths.
pub const RESERVABLE_SHARE_DEFAULT_MILLIS: u64 = 900;

/// The capacity reservations may take on each link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkCapacity {
    /// Every host link's rate (servers' and clients'), bytes/s, as configured (`--link-rate`);
    /// `None`: no admission
    /// control, every reservation is admitted (and still leased).
    pub link_bytes_per_s: Option<u64>,
    /// The share of each link reservations may take, in thousandths (default 900).
    pub reservable_share_millis: u64,
}

impl Default for LinkCapacity {
    fn default() -> LinkCapacity {
        LinkCapacity {
            link_bytes_per_s: None,
            reservable_share_millis: RESERVABLE_SHARE_DEFAULT_MILLIS,
        }
    }
}

impl LinkCapacity {
    /// What reservations may take of a link, bytes/s (`None`: no limit).
    pub fn reservable_bytes_per_s(&self) -> Option<u64> {
        self.link_bytes_per_s.map(|link| {
            let share = u128::from(link) * u128::from(self.reservable_share_millis) / 1_000;
            u64::try_from(share).unwrap_or(u64::MAX)
        })
    }

    /// Where the capacity figure comes from, for the error a refused stream reports.
    fn source(&self) -> String {
        let link = self.link_bytes_per_s.unwrap_or(0);
        format!(
            "{} of the {:.2} MB/s link rate configured on the manager with --link-rate; \
             rates on the wire, with packet headers",
            self.reservable_share_millis as f64 / 1_000.0,
            link as f64 / 1e6
        )
    }
}

/// The server links a stream of the file `meta` at `rate` bytes/s crosses, and what it asks
/// of each: its rate over the file's data columns per column the server holds (a read takes
/// that from each data column, a write puts it, parity included, on every column), on the
/// wire, headers counted ([`wire_bytes_per_s`]; counting payload only, streams booked to
/// 0.9 of a link's payload overflowed it). `addr` names a server's address, if known.
pub fn links_of(
    meta: &FileMeta,
    rate: u64,
    addr: impl Fn(ServerId) -> Option<String>,
) -> Vec<(String, u64)> {
    let data_columns = u64::from(meta.layout.data_per_stripe().max(1));
    let per_column = wire_bytes_per_s(rate.div_ceil(data_columns));
    let mut links = BTreeMap::<ServerId, u64>::new();
    for &server in &meta.servers {
        *links.entry(server).or_default() += per_column;
    }
    links
        .into_iter()
        .map(|(server, asked)| {
            let name = match addr(server) {
                Some(addr) => format!("server {server} ({addr})"),
                None => format!("server {server}"),
            };
            (name, asked)
        })
        .collect()
}

/// The link of the client at `host` for a stream that asks `links` of the servers' links:
/// everything the stream exchanges with its servers crosses it, so it asks their sum.
pub fn client_link(links: &[(String, u64)], host: IpAddr) -> (String, u64) {
    let asked = links
        .iter()
        .fold(0u64, |sum, (_, rate)| sum.saturating_add(*rate));
    (format!("client {host}"), asked)
}

/// One admitted reservation.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Admitted {
    /// The links it crosses and the rate it takes on each, bytes/s.
    links: Vec<(String, u64)>,
    /// When its lease ends.
    expires: Instant,
}

/// The reservations admitted on the cluster's links.
#[derive(Clone, Debug)]
pub struct Reservations {
    capacity: LinkCapacity,
    admitted: BTreeMap<u64, Admitted>,
    /// Admitted rate per link, bytes/s: the sum over `admitted` (wide, so that rates near
    /// 2^64 admitted without a link rate cannot overflow it).
    load: BTreeMap<String, u128>,
    next_id: u64,
}

impl Reservations {
    /// No reservation yet, on links of `capacity`.
    pub fn new(capacity: LinkCapacity) -> Reservations {
        Reservations {
            capacity,
            admitted: BTreeMap::new(),
            load: BTreeMap::new(),
            next_id: 1,
        }
    }

    /// Admits a stream taking `links` (each link's name and the rate it asks of it) at `now`,
    /// or refuses it, naming the first link it does not fit. Returns the reservation's id.
    pub fn admit(
        &mut self,
        mut links: Vec<(String, u64)>,
        now: Instant,
    ) -> Result<u64, ManagerError> {
        self.expire(now);
        links.retain(|(_, rate)| *rate > 0);
        if let Some(reservable) = self.capacity.reservable_bytes_per_s() {
            for (link, asked) in &links {
                let load = self.load(link);
                if u128::from(load) + u128::from(*asked) > u128::from(reservable) {
                    return Err(ManagerError::ReservationRefused {
                        link: link.clone(),
                        asked_bytes_per_s: *asked,
                        available_bytes_per_s: reservable.saturating_sub(load),
                        reservable_bytes_per_s: reservable,
                        capacity: self.capacity.source(),
                    });
                }
            }
        }
        if self.admitted.len() >= RESERVATIONS_MAX {
            return Err(ManagerError::ReservationRefused {
                link: "the manager".into(),
                asked_bytes_per_s: links.iter().fold(0, |sum, (_, r)| r.saturating_add(sum)),
                available_bytes_per_s: 0,
                reservable_bytes_per_s: 0,
                capacity: format!("it holds at most {RESERVATIONS_MAX} reservations"),
            });
        }
        for (link, asked) in &links {
            *self.load.entry(link.clone()).or_default() += u128::from(*asked);
        }
        let id = self.next_id;
        self.next_id += 1;
        let expires = now + RESERVATION_LEASE;
        self.admitted.insert(id, Admitted { links, expires });
        Ok(id)
    }

    /// Extends reservation `id`'s lease from `now`.
    pub fn renew(&mut self, id: u64, now: Instant) -> Result<(), ManagerError> {
        self.expire(now);
        let admitted = self
            .admitted
            .get_mut(&id)
            .ok_or(ManagerError::UnknownReservation(id))?;
        admitted.expires = now + RESERVATION_LEASE;
        Ok(())
    }

    /// Gives reservation `id` back.
    pub fn release(&mut self, id: u64) -> Result<(), ManagerError> {
        let admitted = self
            .admitted
            .remove(&id)
            .ok_or(ManagerError::UnknownReservation(id))?;
        self.unload(&admitted);
        Ok(())
    }

    /// Drops the reservations whose lease ended at or before `now`.
    pub fn expire(&mut self, now: Instant) {
        let expired: Vec<u64> = self
            .admitted
            .iter()
            .filter(|(_, admitted)| admitted.expires <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            if let Some(admitted) = self.admitted.remove(&id) {
                self.unload(&admitted);
            }
        }
    }

    fn unload(&mut self, admitted: &Admitted) {
        for (link, rate) in &admitted.links {
            let load = self
                .load
                .get_mut(link)
                .expect("an admitted link has a load");
            *load = load
                .checked_sub(u128::from(*rate))
                .expect("a link's load sums its reservations");
            if *load == 0 {
                self.load.remove(link);
            }
        }
    }

    /// The rate admitted on `link`, bytes/s.
    pub fn load(&self, link: &str) -> u64 {
        let load = self.load.get(link).copied().unwrap_or(0);
        u64::try_from(load).unwrap_or(u64::MAX)
    }

    /// Reservations admitted.
    pub fn len(&self) -> usize {
        self.admitted.len()
    }

    /// Whether none is admitted.
    pub fn is_empty(&self) -> bool {
        self.admitted.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn capacity(link: u64) -> LinkCapacity {
        LinkCapacity {
            link_bytes_per_s: Some(link),
            ..LinkCapacity::default()
        }
    }

    #[test]
    fn streams_take_their_packets_headers_of_a_link() {
        // 1,416 bytes of payload travel in a 1,514-byte frame.
        assert_eq!(PACKET_PAYLOAD_BYTES + PACKET_OVERHEAD_BYTES, 1_514);
        assert_eq!(wire_bytes_per_s(1_416), 1_514);
        assert_eq!(wire_bytes_per_s(1), 2);
        assert_eq!(wire_bytes_per_s(0), 0);
        assert_eq!(wire_bytes_per_s(u64::MAX), u64::MAX);
        // Five of six fairshare streams of the lab (0.166 of its port's payload, 23.65 MB/s)
        // fit in 0.9 of the 25 MB/s link, with their headers.
        let stream = wire_bytes_per_s(3_925_231);
        assert_eq!(stream, 4_196_893);
        assert!(5 * stream <= 22_500_000 && 6 * stream > 22_500_000);
    }

    #[test]
    fn a_reservation_that_does_not_fit_is_refused_naming_the_link() {
        let now = Instant::now();
        let mut reservations = Reservations::new(capacity(100_000_000));
        let a = reservations
            .admit(vec![("server 1".into(), 60_000_000)], now)
            .unwrap();
        let refused = reservations
            .admit(
                vec![
                    ("server 2".into(), 40_000_000),
                    ("server 1".into(), 40_000_000),
                ],
                now,
            )
            .unwrap_err();
        assert_eq!(
            refused,
            ManagerError::ReservationRefused {
                link: "server 1".into(),
                asked_bytes_per_s: 40_000_000,
                available_bytes_per_s: 30_000_000,
                reservable_bytes_per_s: 90_000_000,
                capacity: "0.9 of the 100.00 MB/s link rate configured on the manager with \
                           --link-rate; rates on the wire, with packet headers"
                    .into(),
            }
        );
        assert_eq!(
            refused.to_string(),
            "reservation refused: server 1 has 30.00 MB/s of 90.00 MB/s reservable left, 40.00 \
             MB/s asked (0.9 of the 100.00 MB/s link rate configured on the manager with \
             --link-rate; rates on the wire, with packet headers)"
        );
        // The refused one took nothing anywhere.
        assert_eq!(reservations.load("server 2"), 0);
        // What fits is admitted; released, its rate is free again.
        reservations
            .admit(vec![("server 1".into(), 30_000_000)], now)
            .unwrap();
        reservations.release(a).unwrap();
        assert_eq!(reservations.load("server 1"), 30_000_000);
        assert_eq!(
            reservations.release(a),
            Err(ManagerError::UnknownReservation(a))
        );
    }

    #[test]
    fn reservations_lapse_unless_renewed() {
        let now = Instant::now();
        let mut reservations = Reservations::new(capacity(100));
        let kept = reservations.admit(vec![("l".into(), 40)], now).unwrap();
        let lapsed = reservations.admit(vec![("l".into(), 50)], now).unwrap();
        let later = now + RESERVATION_LEASE / 2;
        reservations.renew(kept, later).unwrap();
        reservations.expire(now + RESERVATION_LEASE);
        assert_eq!(reservations.load("l"), 40);
        assert_eq!(
            reservations.renew(lapsed, now + RESERVATION_LEASE),
            Err(ManagerError::UnknownReservation(lapsed))
        );
        reservations.expire(later + RESERVATION_LEASE);
        assert!(reservations.is_empty());
        assert_eq!(reservations.load("l"), 0);
    }

    #[test]
    fn without_a_link_rate_everything_is_admitted() {
        let mut reservations = Reservations::new(LinkCapacity::default());
        for _ in 0..10 {
            reservations
                .admit(vec![("l".into(), u64::MAX / 2)], Instant::now())
                .unwrap();
        }
        assert_eq!(reservations.len(), 10);
        assert_eq!(reservations.load("l"), u64::MAX);
    }

    /// Through the manager: a RAID-5 file over three servers puts half a stream's rate on
    /// each server's link (two data columns), with the headers of its packets (50 MB/s of
    /// payload take 53.61 MB/s of the link).
    #[test]
    fn the_manager_admits_streams_of_a_file_on_its_servers_links() {
        use tessera_layout::Scheme;
        use tessera_wire::{LayoutRequest, ManagerRequest, ManagerResponse};
        let dir = tempfile::tempdir().unwrap();
        let mut manager = manager_with_servers(dir.path(), 100_000_000, 3);
        let now = Instant::now();
        let create = ManagerRequest::Create {
            path: "/video".into(),
            layout: LayoutRequest {
                scheme: Scheme::Raid5,
                stripe_unit: 65_536,
                width: Some(3),
            },
            replace: false,
        };
        let ManagerResponse::File(view) = manager.handle(create, now) else {
            panic!("created");
        };
        let file = view.meta.id;
        let reserve = |rate_bytes_per_s| ManagerRequest::Reserve {
            file,
            rate_bytes_per_s,
        };
        let ManagerResponse::Reserved { id, lease_ms } = manager.handle(reserve(100_000_000), now)
        else {
            panic!("the first stream fits");
        };
        assert_eq!(lease_ms, RESERVATION_LEASE.as_millis() as u64);
        let ManagerResponse::Error(refused) = manager.handle(reserve(100_000_000), now) else {
            panic!("the second does not");
        };
        assert!(
            refused
                .to_string()
                .starts_with("reservation refused: server 1 (127.0.0.1:7001) has 36.54 MB/s"),
            "{refused}"
        );
        assert!(matches!(
            manager.handle(reserve(60_000_000), now),
            ManagerResponse::Reserved { .. }
        ));
        let release = ManagerRequest::ReleaseReservation { id };
        assert_eq!(manager.handle(release.clone(), now), ManagerResponse::Done);
        assert!(matches!(
            manager.handle(reserve(100_000_000), now),
            ManagerResponse::Reserved { .. }
        ));
        assert_eq!(
            manager.handle(release, now),
            ManagerResponse::Error(ManagerError::UnknownReservation(id))
        );
        // The lease runs out at the tick after it ends.
        manager.tick(now + RESERVATION_LEASE);
        assert!(matches!(
            manager.handle(reserve(160_000_000), now + RESERVATION_LEASE),
            ManagerResponse::Reserved { .. }
        ));
    }

    /// The mirror case: six reader processes on one host, each reading a file alone on its
    /// server, at the unfair shares of a 25 MB/s link. Each server's link has room for its
    /// stream; the readers' host's link has room for the first three only, and the manager
    /// says so naming that host. Another host's streams are counted on its own link.
    #[test]
    fn streams_of_one_client_host_are_admitted_on_its_link() {
        use tessera_layout::Scheme;
        use tessera_wire::{LayoutRequest, ManagerRequest, ManagerResponse};
        let dir = tempfile::tempdir().unwrap();
        let mut manager = manager_with_servers(dir.path(), 25_000_000, 6);
        let now = Instant::now();
        let mut files = Vec::new();
        for i in 0..6u16 {
            let create = ManagerRequest::Create {
                path: format!("/stream{i}"),
                layout: LayoutRequest {
                    scheme: Scheme::Raid0,
                    stripe_unit: 65_536,
                    width: Some(1),
                },
                replace: false,
            };
            let ManagerResponse::File(view) = manager.handle(create, now) else {
                panic!("created");
            };
            files.push(view.meta.id);
        }
        let servers: BTreeSet<_> = files.iter().map(|&f| server_of(&mut manager, f)).collect();
        assert_eq!(servers.len(), 6, "each file alone on its server");
        let readers: IpAddr = "10.0.0.7".parse().unwrap();
        let shares_millis = [500u64, 250, 125, 62, 31, 31];
        let mut admitted = Vec::new();
        for (&file, share) in files.iter().zip(shares_millis) {
            let reserve = ManagerRequest::Reserve {
                file,
                rate_bytes_per_s: 23_580_000 * share / 1_000,
            };
            match manager.handle_from(reserve, Some(readers), now) {
                ManagerResponse::Reserved { .. } => admitted.push(true),
                ManagerResponse::Error(refused) => {
                    let refused = refused.to_string();
                    assert!(refused.contains("client 10.0.0.7 has"), "{refused}");
                    admitted.push(false);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(admitted, [true, true, true, false, false, false]);
        // Stream 4 from another host fits: its link is its own, its server's has room.
        let elsewhere = ManagerRequest::Reserve {
            file: files[3],
            rate_bytes_per_s: 23_580_000 * 62 / 1_000,
        };
        assert!(matches!(
            manager.handle_from(elsewhere, Some("10.0.0.8".parse().unwrap()), now),
            ManagerResponse::Reserved { .. }
        ));
    }

    /// A manager admitting against links of `link` bytes/s, with `servers` servers
    /// registered (at 127.0.0.1:7001 and on).
    fn manager_with_servers(dir: &std::path::Path, link: u64, servers: u16) -> crate::Manager {
        use tessera_wire::{ManagerRequest, ManagerResponse};
        let config = crate::ManagerConfig {
            links: capacity(link),
            ..crate::ManagerConfig::default()
        };
        let mut manager = crate::Manager::open(dir, config).unwrap();
        for port in 0..servers {
            let register = ManagerRequest::Register {
                server: None,
                addr: format!("127.0.0.1:{}", 7001 + port),
                incarnation: 7 + u64::from(port),
                cluster: None,
            };
            assert!(matches!(
                manager.handle(register, Instant::now()),
                ManagerResponse::Registered { .. }
            ));
        }
        manager
    }

    fn server_of(manager: &mut crate::Manager, file: tessera_wire::FileId) -> ServerId {
        let request = tessera_wire::ManagerRequest::LookupId { file };
        match manager.handle(request, Instant::now()) {
            tessera_wire::ManagerResponse::File(view) => view.meta.servers[0],
            other => panic!("{other:?}"),
        }
    }

    proptest! {
        /// Whatever is asked, admitted, renewed, released or left to lapse, no link ever
        /// carries more than its reservable share, and each link's load is the sum of the
        /// reservations admitted on it.
        #[test]
        fn admitted_reservations_never_exceed_the_share(
            link in 1u64..1_000_000_000_000,
            share in 1u64..=1_000,
            steps in prop::collection::vec((0u8..4, 0usize..3, 0u64..1_000_000_000_000, 0u64..30), 1..200),
        ) {
            let capacity = LinkCapacity { link_bytes_per_s: Some(link), reservable_share_millis: share };
            let reservable = capacity.reservable_bytes_per_s().unwrap();
            let mut reservations = Reservations::new(capacity);
            let start = Instant::now();
            let mut ids = Vec::new();
            for (op, which, rate, seconds) in steps {
                let now = start + Duration::from_secs(seconds);
                let name = |index: usize| format!("server {index}");
                match op {
                    0 | 1 => {
                        let links = vec![(name(which), rate), (name((which + 1) % 3), rate / 2)];
                        if let Ok(id) = reservations.admit(links, now) {
                            ids.push(id);
                        }
                    }
                    2 => {
                        if let Some(&id) = ids.get(which) {
                            let _ = reservations.renew(id, now);
                        }
                    }
                    _ => {
                        if let Some(&id) = ids.get(which) {
                            let _ = reservations.release(id);
                        }
                    }
                }
                for index in 0..3 {
                    prop_assert!(reservations.load(&name(index)) <= reservable);
                }
                let mut sums = BTreeMap::<String, u128>::new();
                for admitted in reservations.admitted.values() {
                    for (link, rate) in &admitted.links {
                        *sums.entry(link.clone()).or_default() += u128::from(*rate);
                    }
                }
                sums.retain(|_, sum| *sum > 0);
                let mut loads = reservations.load.clone();
                loads.retain(|_, load| *load > 0);
                prop_assert_eq!(sums, loads);
            }
        }
    }
}
