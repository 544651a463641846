//! The node: sender, receiver and view change in one sans-IO state machine.

mod fetch;
mod lease;
mod membership;
mod pause;
mod receive;
mod send;
mod view;

use crate::log::Log;
use crate::packet::{self, Body, Header, ImagePart, LogImage, Packet};
use crate::parts::Assembly;
use crate::rtt::RttEstimator;
use crate::{
    Config, Destination, Event, Group, GroupChange, GroupRecord, Micros, NodeId, ProposeError,
    Role, SenderId, Start, Status, Transmit, MESSAGE_APPLICATION,
};
pub use fetch::FETCH_POSITIONS_MAX;

use bytes::{BufMut, Bytes, BytesMut};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::{BTreeMap, VecDeque};

/// What a node counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Packets handed to [`Node::handle_packet`].
    pub packets_received: u64,
    /// Packets refused by the decoder.
    pub malformed: u64,
    /// Packets from nodes outside the group or from an earlier incarnation.
    pub stale: u64,
    /// Packets sent.
    pub packets_sent: u64,
    /// DATA packets sent.
    pub data_packets_sent: u64,
    /// ACKs sent on a DATA packet of ours (piggybacked, section 3.1).
    pub acks_piggybacked: u64,
    /// ACKs sent in a packet of their own.
    pub ack_packets_sent: u64,
    /// Messages sent for the first time.
    pub messages_sent: u64,
    /// Messages sent again (the sum of the three causes below).
    pub retransmitted: u64,
    /// Of those, asked for by a receiver's NACK.
    pub retransmitted_nacked: u64,
    /// Of those, in an own DATA packet that did not come back through the network while a
    /// later one did (lost on the way: a full queue, a full socket buffer).
    pub retransmitted_unreturned: u64,
    /// Of those, not held by some member after the retransmission timeout
    /// (`retransmit_after_us`, stretched to twice the time members took to hold our
    /// messages lately when longer).
    pub retransmitted_timeout: u64,
    /// Times the window was halved: an own packet did not come back through the network
    /// (see [`crate::Config::window_packets_min`]).
    pub window_cuts: u64,
    /// Messages received again after they were in the log.
    pub duplicates: u64,
    /// NACKs sent.
    pub nacks_sent: u64,
    /// ENTRIES the leader sent to align a member's log.
    pub repairs_sent: u64,
    /// Positions replaced by the leader's order.
    pub positions_replaced: u64,
    /// Times this receiver paused its log (a gap in a sender's numbering, or the leader's
    /// ACK conflicting with its log): it held what arrived until the gap filled or the
    /// leader's order came.
    pub pauses: u64,
    /// Pauses that ended by their timeout (what was held appended in arrival order).
    pub pauses_timed_out: u64,
    /// Times a paused member compared everything it held, in the order it would append
    /// it, with the leader's ACKs (each a sort and a hash chain over what is held).
    pub pause_checks: u64,
    /// ENTRIES entries without bytes whose message this member did not hold after all
    /// (asked of its sender instead).
    pub repair_bytes_missing: u64,
    /// Entries sent in ENTRIES, and those of them that carried the message's bytes.
    pub repair_entries: u64,
    /// See `repair_entries`.
    pub repair_payloads: u64,
    /// View changes started.
    pub view_changes: u64,
    /// DO-VIEW-CHANGE and START-VIEW packets sent (a long log takes several parts).
    pub view_change_parts_sent: u64,
    /// MISSING packets sent (asking for lost parts of a view-change message).
    pub missing_sent: u64,
    /// FETCH packets sent (asking a member for positions below a view's log).
    pub fetches_sent: u64,
    /// Parts of our log sent in answer to FETCH.
    pub fetch_parts_sent: u64,
    /// Positions below a view's log we had not delivered and fetched from a member
    /// (instead of a state transfer, [`crate::Event::Gap`]).
    pub positions_fetched: u64,
    /// Messages UTO-delivered.
    pub delivered: u64,
    /// Time proposals waited while the window was full, microseconds (to the last time a
    /// packet was asked for).
    pub window_full_us: u64,
    /// Group changes this node delivered that made the next epoch.
    pub group_changes: u64,
}

/// A message of this node's, sent and not yet UTO-delivered.
#[derive(Debug)]
struct Flight {
    message: Bytes,
    sent_at: Micros,
    /// The DATA packet that first carried it.
    packet: u64,
    /// Sent more than once (its hold time is no sample: which sending was held?).
    sent_again: bool,
}

/// Why a message is due to be sent again before its timeout (counted in [`Stats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resend {
    /// A receiver's NACK asked for it.
    Nacked,
    /// Its DATA packet did not come back through the network while a later one did.
    Unreturned,
}

/// The sender's side: FIFO numbering, the window, retransmission.
#[derive(Debug, Default)]
struct SendState {
    next_seq: u64,
    queue: VecDeque<Bytes>,
    /// Messages sent and not yet UTO-delivered (kept to be sent again).
    in_flight: BTreeMap<u64, Flight>,
    /// The window: per DATA packet first sent, its messages not yet held by every member.
    packets_in_flight: BTreeMap<u64, u32>,
    /// Per DATA packet first sent, its messages not yet UTO-delivered.
    packets_retained: BTreeMap<u64, u32>,
    /// Our messages below this were held by every member (or delivered): out of the window.
    held_by_all: u64,
    /// How long every member took to hold a message of ours, smoothed (`None` before the
    /// first): the retransmission timeout stretches to twice it.
    hold_us: Option<Micros>,
    /// Per receiver, how many of our messages its log held at its latest ACK in
    /// `held_view`, and the members that view's ACKs named.
    held_by: BTreeMap<NodeId, u64>,
    held_view: u64,
    held_members: u64,
    next_packet: u64,
    /// Sequence numbers due again at the next transmit, with why.
    nacked: BTreeMap<u64, Resend>,
    /// The highest view a receiver's ACK named (a sender-only node's header carries it).
    known_view: u64,
    /// Since when proposals wait for a full window.
    window_full_since: Option<Micros>,
    /// The window now, packets (`Config::window_packets_min..=window_packets`).
    window_packets_now: u32,
    /// Own packets back since the window last grew or was cut.
    window_returned: u32,
    /// The window is not cut again before this: one cut per round trip.
    window_cut_until: Micros,
    /// Our DATA packets not yet back through the network: checksum, messages.
    unreturned: VecDeque<(u32, Vec<u64>)>,
    /// Where proposals are framed: each a slice of one shared buffer, so that a message
    /// costs no allocation of its own (nor one more when a packet takes a reference).
    arena: BytesMut,
}

/// Bytes of the buffer proposals are framed in, allocated when the last is used up.
const PROPOSAL_ARENA_BYTES: usize = 64 << 10;

/// What this node knows of another member's log in the current view.
#[derive(Debug, Default)]
struct Peer {
    /// ACKs `(length, hash)` not yet compared with our log (it is shorter).
    history: VecDeque<(u64, u64)>,
    /// The member's latest ACK in this view: compared again once the leader's order
    /// replaced part of our log (it conflicted with what we had, and the member may send
    /// no other until its next heartbeat).
    latest: Option<(u64, u64)>,
    /// The member's log equals ours at positions `0..matched`.
    matched: u64,
    /// Positions the member delivered.
    delivered: u64,
    /// When the leader last sent it ENTRIES.
    repaired_at: Option<Micros>,
    /// `matched` when the leader last sent it ENTRIES.
    matched_at_repair: u64,
    /// Repairs in a row after which its `matched` did not move.
    repairs_unanswered: u32,
    /// Per sender, how many of its messages the member's log held at its last ACK: the
    /// leader's ENTRIES carry the bytes of the others only where the member seems stuck.
    held: BTreeMap<SenderId, u64>,
}

/// The receiver's side: the log, delivery, ACKs.
#[derive(Debug, Default)]
struct ReceiveState {
    log: Log,
    /// Messages past a gap in their sender's numbering (or set aside by the leader's
    /// order), by sender and sequence number, each with its place in arrival order (to
    /// append them again in that order).
    pending: BTreeMap<SenderId, BTreeMap<u64, (u64, Bytes)>>,
    commit: u64,
    delivered: u64,
    /// Per sender, its messages at positions `..delivered`.
    delivered_counts: BTreeMap<SenderId, u64>,
    /// Positions reported with [`Event::Optimistic`].
    optimistic_end: u64,
    peers: BTreeMap<NodeId, Peer>,
    ack_owed: u32,
    ack_due: Option<Micros>,
    ack_now: bool,
    /// When our last fresh ACK is sent again (see `ack_sent`).
    ack_again_at: Option<Micros>,
    /// ACKs sent since the last fresh one (the pause before the next doubles each time).
    ack_again_rounds: u32,
    /// When our last ACK packet of fresh appends went (one on DATA costs no packet and does
    /// not count): the next waits for more appends only if it would follow within the ACK
    /// delay (see `ack_due_after`). A sender's own message, back through the network right
    /// after the DATA that carried its ACK, is still ACKed at once.
    ack_fresh_at: Option<Micros>,
    nacked_at: BTreeMap<SenderId, Micros>,
    repair_check_at: Micros,
    /// The end of our log at the leader's last repair check.
    end_at_check: u64,
    /// Messages that arrived so far (each one's place in arrival order).
    arrivals: u64,
    /// The rest of the leader's order from the end of our log, stopped at a message whose
    /// bytes we lack: we append nothing else until it is done.
    leader_order: VecDeque<crate::packet::RepairEntry>,
    /// The lowest position some member had not delivered at our last look (ours included):
    /// our DO-VIEW-CHANGE carries the log from there (below it, every member delivered).
    floor: u64,
    /// Where this view's START-VIEW log began: every member holds the same positions below
    /// (all delivered them), so repairs begin there at the lowest (a member may keep no
    /// more than that).
    view_start: u64,
    /// Positions below the view's log that we had not delivered, being fetched.
    fetch: Option<Fetch>,
    /// Our log paused past a gap or a conflict with the leader's order: what arrives is held.
    pause: Option<Pause>,
    /// Per sender, messages below this number that we lost, noticed (by an ACK of its
    /// sender's that counted them) when this many messages had arrived: they go there
    /// once they come (see `pause.rs`).
    lost_before: BTreeMap<SenderId, (u64, u64)>,
}

/// A receiver's log paused: it appends nothing until the gap that paused it fills or the
/// leader's order for it arrives, so that a loss costs a repair of the positions appended
/// between the lost message's place and the pause, not of everything appended until the
/// repair arrives.
#[derive(Clone, Copy, Debug)]
struct Pause {
    /// When it began (it ends at the latest four round trips later).
    since: Micros,
    /// The leader's ACK of this length conflicted with our log: the leader's order, or an
    /// ACK of the leader at least this long that agrees with us, ends it.
    conflict: Option<u64>,
}

/// Positions `start..end` (`end`: where the view's log begins) that we had not delivered
/// when we adopted the view, asked of its members; we deliver nothing until they are in.
#[derive(Debug)]
struct Fetch {
    start: u64,
    end: u64,
    /// Our hash chain at `start` (what we delivered): the image must continue it.
    start_hash: u64,
    /// Questions sent so far, and when the last went.
    asked: u32,
    asked_at: Micros,
    /// The member whose parts arrived since our last question: asked again.
    source: Option<NodeId>,
    assembly: Option<Assembly>,
}

/// A DO-VIEW-CHANGE as the new leader keeps it.
#[derive(Clone, Debug)]
struct ViewChangeVote {
    last_normal: Option<u64>,
    delivered: u64,
    log: LogImage,
}

/// The view change in progress.
#[derive(Debug, Default)]
struct ChangeState {
    deadline: Micros,
    votes: BTreeMap<NodeId, ViewChangeVote>,
    quorum_at: Option<Micros>,
    joining_since: Micros,
    /// Leader: DO-VIEW-CHANGEs whose parts are still arriving.
    assembling: BTreeMap<NodeId, Assembly>,
    /// Leader: receivers heard changing to this view (their vote is due).
    changing: std::collections::BTreeSet<NodeId>,
    /// When we last asked each node for missing parts.
    asked_at: BTreeMap<NodeId, Micros>,
    /// Voter: the first position of our DO-VIEW-CHANGE's log.
    vote_from: u64,
    /// Voter: a normal member of this view was heard (the view started; its START-VIEW
    /// did not reach us whole).
    started: bool,
}

/// A START-VIEW whose parts are arriving: its view, its leader and the parts.
#[derive(Debug)]
struct IncomingStartView {
    view: u64,
    assembly: Assembly,
}

/// A whole START-VIEW we may not enter yet (read leases: it leaves out a node heard
/// lately), taken again at the tick once the time comes.
#[derive(Debug)]
struct DeferredStartView {
    header: Header,
    members: u64,
    commit: u64,
    group: GroupRecord,
    log: LogImage,
}

/// Leader: the START-VIEW we sent in our view, to send again the parts a member lacks.
#[derive(Debug)]
struct StartViewSent {
    view: u64,
    members: u64,
    commit: u64,
    /// The group it runs.
    group: GroupRecord,
    /// Its image's bounds and hashes (entries empty).
    bounds: ImagePart,
}

/// What this node knows of the group: the one its view runs, the newest it heard of, and
/// where its deliveries stand.
#[derive(Debug)]
struct Membership {
    /// The group of the view we are in (or change to): leader, members, quorums.
    record: GroupRecord,
    /// The newest group known (a delivered change, a START-VIEW, a peer's word): a view
    /// change runs it.
    known: GroupRecord,
    /// The epoch after the positions we delivered (a node that joined by state transfer
    /// starts at its view's). A view of epoch `e` delivers nothing past the change that
    /// makes `e + 1`: from there the next view's group counts the ACKs.
    delivered_epoch: u32,
    /// When we last told each node of a newer group than its header named.
    told_at: BTreeMap<NodeId, Micros>,
    /// No longer a receiver of the group.
    removed: bool,
}

/// One member of the group: see the crate documentation for the protocol and the order in
/// which to call the methods.
#[derive(Debug)]
pub struct Node {
    config: Config,
    group: Group,
    membership: Membership,
    id: NodeId,
    incarnation: u32,
    role: Role,
    rng: StdRng,
    view: u64,
    status: Status,
    members: u64,
    last_normal: Option<u64>,
    last_heard: BTreeMap<NodeId, Micros>,
    last_sent: Micros,
    next_tick: Micros,
    latest_incarnation: BTreeMap<NodeId, u32>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    send: SendState,
    receive: ReceiveState,
    change: ChangeState,
    incoming_start_view: Option<IncomingStartView>,
    start_view_sent: Option<StartViewSent>,
    /// Read leases ([`Config::read_leases`]), and a START-VIEW whose entry waits for them.
    lease: lease::LeaseState,
    deferred_start_view: Option<DeferredStartView>,
    rtt: RttEstimator,
    stats: Stats,
}

fn bit(node: NodeId) -> u64 {
    1u64 << node.0
}

/// The nodes of a member set.
pub fn members_of(members: u64) -> Vec<NodeId> {
    (0..64u16)
        .filter(|i| members & (1 << i) != 0)
        .map(NodeId)
        .collect()
}

impl Node {
    /// Node `id` of `group` in its `incarnation` (higher after every restart), seeded with
    /// `seed`, at time `now`. Panics if the group or config is invalid or `id` not in it.
    pub fn new(
        config: Config,
        group: Group,
        id: NodeId,
        incarnation: u32,
        start: Start,
        seed: u64,
        now: Micros,
    ) -> Node {
        config.validate().expect("valid config");
        let receivers = group.receivers();
        assert!(
            !receivers.is_empty() && group.roles.len() <= crate::GROUP_NODES_MAX,
            "invalid group"
        );
        let in_group = group.role(id).filter(|role| role.sender || role.receiver);
        // A node not (or no longer) in the group it was given holds nothing and waits to
        // hear of one that makes it a receiver.
        let role = match (in_group, start) {
            (Some(role), _) => role,
            (None, Start::Initial) => panic!("node in the group"),
            (None, _) => Role {
                sender: false,
                receiver: true,
            },
        };
        let all = receivers.iter().fold(0, |set, &node| set | bit(node));
        let status = match (role.receiver, start) {
            (false, _) => Status::Sender,
            (true, Start::Initial) => Status::Normal,
            (true, Start::Restarted | Start::Added) => Status::Joining,
        };
        let record = GroupRecord::initial(&group);
        let window_packets = config.window_packets;
        let mut node = Node {
            config,
            membership: Membership {
                record,
                known: record,
                delivered_epoch: 0,
                told_at: BTreeMap::new(),
                removed: false,
            },
            id,
            incarnation,
            role,
            rng: StdRng::seed_from_u64(crate::log::mix(seed)),
            view: 0,
            status,
            members: if status == Status::Normal { all } else { 0 },
            last_normal: (status == Status::Normal).then_some(0),
            last_heard: receivers.iter().map(|&node| (node, now)).collect(),
            last_sent: now,
            next_tick: now,
            latest_incarnation: BTreeMap::from([(id, incarnation)]),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            send: SendState {
                window_packets_now: window_packets,
                ..SendState::default()
            },
            receive: ReceiveState::default(),
            change: ChangeState {
                joining_since: now,
                ..ChangeState::default()
            },
            incoming_start_view: None,
            start_view_sent: None,
            lease: lease::LeaseState::new(now),
            deferred_start_view: None,
            rtt: RttEstimator::default(),
            stats: Stats::default(),
            group,
        };
        if status == Status::Normal {
            node.enter_normal(now);
            node.events.push_back(Event::Joined { position: 0 });
        }
        node
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The view this node is in (or changing to).
    pub fn view(&self) -> u64 {
        self.view
    }

    /// Its status.
    pub fn status(&self) -> Status {
        self.status
    }

    /// Whether it holds no state it could vouch for (restarted and not yet in a view).
    pub fn is_fresh(&self) -> bool {
        self.role.receiver && self.last_normal.is_none()
    }

    /// The group of this node's view (or of the view change in progress).
    pub fn group_record(&self) -> GroupRecord {
        self.membership.record
    }

    /// The newest group this node knows of.
    pub fn known_group(&self) -> GroupRecord {
        self.membership.known
    }

    /// Whether this node learnt that it is no longer a receiver of the group.
    pub fn is_removed(&self) -> bool {
        self.membership.removed
    }

    /// Positions UTO-delivered.
    pub fn delivered(&self) -> u64 {
        self.receive.delivered
    }

    /// The end of its log (the next position of its preliminary order).
    pub fn log_end(&self) -> u64 {
        self.receive.log.end()
    }

    /// One line of this node's state, for a failing run's report.
    pub fn summary(&self) -> String {
        let matched: Vec<(u16, u64, usize)> = self
            .receive
            .peers
            .iter()
            .map(|(node, peer)| (node.0, peer.matched, peer.history.len()))
            .collect();
        format!(
            "node {} inc {} {:?} group {:?} known epoch {} delivered epoch {} view {} members {:#b} last_normal {:?} log {}..{} commit {} \
             delivered {} unacked {} (queue {}, next_seq {}, known view {}) peers(matched, history) {:?} pending {:?} leader order {:?} (+{})",
            self.id.0,
            self.incarnation,
            self.status,
            self.membership.record,
            self.membership.known.epoch,
            self.membership.delivered_epoch,
            self.view,
            self.members,
            self.last_normal,
            self.receive.log.start(),
            self.receive.log.end(),
            self.receive.commit,
            self.receive.delivered,
            self.unacked(),
            self.send.queue.len(),
            self.send.next_seq,
            self.send.known_view,
            matched,
            self.receive.pending.iter().map(|(s, m)| (s.node.0, s.incarnation, self.receive.log.count(*s), m.keys().next().copied())).collect::<Vec<_>>(),
            self.receive.leader_order.front().map(|e| e.id),
            self.receive.leader_order.len(),
        )
    }

    /// Own messages proposed and not yet acked by every member.
    pub fn unacked(&self) -> usize {
        self.send.queue.len() + self.send.in_flight.len()
    }

    /// What it counted.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Broadcasts `message` in total order. Refused if this node does not send, the message
    /// does not fit a packet, or `send_queue_messages_max` proposals wait.
    pub fn propose(&mut self, message: Bytes, _now: Micros) -> Result<(), ProposeError> {
        if !self.role.sender {
            return Err(ProposeError::NotSender);
        }
        if message.len() > self.config.message_bytes_max() {
            return Err(ProposeError::TooLarge(message.len()));
        }
        if self.send.queue.len() >= self.config.send_queue_messages_max {
            return Err(ProposeError::QueueFull);
        }
        let arena = &mut self.send.arena;
        if arena.capacity() < message.len() + 1 {
            *arena = BytesMut::with_capacity(PROPOSAL_ARENA_BYTES.max(message.len() + 1));
        }
        arena.put_u8(MESSAGE_APPLICATION);
        arena.extend_from_slice(&message);
        self.send.queue.push_back(arena.split().freeze());
        Ok(())
    }

    /// Broadcasts a change of the group in total order: from where it is UTO-delivered,
    /// `node` has `role` (`Role { sender: false, receiver: false }`: removed), if nothing
    /// changed the group since the newest group this node knows (the change names the
    /// next epoch; a change that lost that race is delivered and ignored). The view after
    /// it runs the new group. Refused like [`Node::propose`]; the change proposed.
    pub fn propose_group_change(
        &mut self,
        node: NodeId,
        role: Role,
        _now: Micros,
    ) -> Result<GroupChange, ProposeError> {
        if !self.role.sender {
            return Err(ProposeError::NotSender);
        }
        if usize::from(node.0) >= crate::GROUP_NODES_MAX {
            return Err(ProposeError::NodeId(node.0));
        }
        if self.send.queue.len() >= self.config.send_queue_messages_max {
            return Err(ProposeError::QueueFull);
        }
        let change = GroupChange {
            epoch: self.membership.known.epoch + 1,
            node,
            role,
        };
        if self.membership.known.apply(&change).is_none() {
            return Err(ProposeError::NoReceiver);
        }
        self.send.queue.push_back(change.encode());
        Ok(change)
    }

    /// A packet arrived (from any node, this one included: a node receives its own
    /// broadcasts through the network, as everyone's).
    pub fn handle_packet(&mut self, bytes: &[u8], now: Micros) {
        self.stats.packets_received += 1;
        let Ok(packet) = packet::decode(bytes) else {
            self.stats.malformed += 1;
            return;
        };
        let header = packet.header;
        if let Body::Group(record) = packet.body {
            // From any node of the cluster: a node that missed changes may not know the
            // node that tells it of them.
            self.learn_group(record, now);
            self.progress(now);
            return;
        }
        let Some(role) = self.peer_role(header.from) else {
            self.stats.stale += 1;
            return;
        };
        let latest = *self
            .latest_incarnation
            .entry(header.from)
            .or_insert(header.incarnation);
        if header.incarnation < latest {
            self.stats.stale += 1;
            return;
        }
        if header.incarnation > latest {
            self.new_incarnation(header.from, header.incarnation);
        }
        let own = header.from == self.id;
        if !own {
            self.tell_group(&header, now);
        }
        if own {
            let lost = self.rtt.on_returned(bytes, now);
            self.own_returned(bytes, &lost);
            let data = matches!(packet.body, Body::Data { .. });
            self.adapt_window(!lost.is_empty(), data, now);
        } else {
            self.last_heard.insert(header.from, now);
            let start_view = matches!(packet.body, Body::StartView { .. });
            if self.role.receiver && role.receiver && !start_view {
                self.observe(&header, now);
            }
        }
        self.dispatch(header, packet.body, own, now);
        self.progress(now);
    }

    fn dispatch(&mut self, header: Header, body: Body, own: bool, now: Micros) {
        // Only receivers take part in ordering; a sender hears ACKs and NACKs.
        let ordering = matches!(
            body,
            Body::Entries { .. }
                | Body::DoViewChange { .. }
                | Body::StartView { .. }
                | Body::Missing { .. }
                | Body::Fetch { .. }
                | Body::LogPart(_)
                | Body::Group(_)
        );
        if ordering && !self.role.receiver {
            return;
        }
        let sender = SenderId {
            node: header.from,
            incarnation: header.incarnation,
        };
        match body {
            Body::Data { ack, messages } => {
                if let Some(ack) = ack {
                    self.on_ack(&header, &ack, own, now);
                }
                self.on_data(sender, messages, now);
            }
            Body::Ack(ack) => self.on_ack(&header, &ack, own, now),
            Body::Nack { sender, from, to } => self.on_nack(sender, from, to, now),
            Body::Heartbeat => {}
            Body::Entries {
                from,
                prev_hash,
                entries,
            } => self.on_entries(&header, from, prev_hash, entries, now),
            Body::DoViewChange {
                last_normal,
                commit,
                group,
                part,
            } => self.on_vote_part(&header, (last_normal, commit, group), part, now),
            Body::StartView {
                members,
                commit,
                group,
                part,
            } => {
                if !own {
                    self.on_start_view_part(&header, (members, commit, group), part, now);
                }
            }
            Body::Missing { from, to } => self.on_missing(&header, from, to),
            Body::Fetch {
                start,
                end,
                from,
                to,
            } => self.on_fetch(&header, (start, end), (from, to)),
            Body::LogPart(part) => self.on_log_part(&header, part, now),
            Body::Group(_) => unreachable!("handled before the group's roles"),
        }
    }

    fn new_incarnation(&mut self, node: NodeId, incarnation: u32) {
        self.latest_incarnation.insert(node, incarnation);
        self.receive
            .pending
            .retain(|sender, _| sender.node != node || sender.incarnation >= incarnation);
        self.receive
            .nacked_at
            .retain(|sender, _| sender.node != node || sender.incarnation >= incarnation);
    }

    /// Time passed; call when [`Node::poll_timeout`] says.
    pub fn handle_timeout(&mut self, now: Micros) {
        if now >= self.next_tick {
            self.next_tick = now + self.tick_interval();
            self.tick(now);
        }
        if self.laggard_check_due().is_some_and(|due| due <= now) {
            self.receive.repair_check_at = now;
            self.repair_laggards(now);
        }
        if self.nack_due().is_some_and(|due| due <= now) {
            self.nack_gaps(now);
        }
        if self.fetch_due().is_some_and(|due| due <= now) {
            self.ask_fetch(now);
        }
        if self.pause_due().is_some_and(|due| due <= now) {
            self.stats.pauses_timed_out += 1;
            self.resume(now);
        }
        self.progress(now);
    }

    /// The measured round trip, at least `rtt_floor_us` and at most a quarter of the
    /// retransmission timeout (the pace before this estimator).
    fn round_trip_us(&self) -> Micros {
        self.rtt.round_trip_us(
            self.config.rtt_floor_us,
            self.config.retransmit_after_us / 4,
        )
    }

    /// The round trip through an empty queue (see [`crate::rtt`]), within the same bounds.
    fn round_trip_us_min(&self) -> Micros {
        self.rtt.round_trip_us_min(
            self.config.rtt_floor_us,
            self.config.retransmit_after_us / 4,
        )
    }

    /// Leader: when to look for members whose log stopped short of ours (a loss nobody's
    /// numbering reveals, such as a sender's last message); `None` if none lags.
    fn laggard_check_due(&self) -> Option<Micros> {
        let leading =
            self.role.receiver && self.status == Status::Normal && self.leader() == self.id;
        let end = self.receive.log.end();
        let lagging = self.receive.peers.values().any(|peer| peer.matched < end);
        // A member ACKs at least every heartbeat interval, so a lost ACK is no reason.
        let round_trip = self.round_trip_us();
        let interval = (4 * round_trip + self.config.ack_delay_us)
            .max(self.config.heartbeat_interval_us + round_trip)
            .min(self.config.retransmit_after_us);
        (leading && lagging).then_some(self.receive.repair_check_at + interval)
    }

    fn tick_interval(&self) -> Micros {
        (self
            .config
            .heartbeat_interval_us
            .min(self.config.retransmit_after_us)
            / 2)
        .max(1)
    }

    /// When [`Node::handle_timeout`] must be called at the latest.
    pub fn poll_timeout(&self) -> Option<Micros> {
        let mut deadline = self.next_tick;
        if let Some(due) = self
            .receive
            .ack_due
            .filter(|_| self.status == Status::Normal)
        {
            deadline = deadline.min(due);
        }
        if let Some(due) = self.laggard_check_due() {
            deadline = deadline.min(due);
        }
        if let Some(due) = self.ack_again_due() {
            deadline = deadline.min(due);
        }
        if let Some(due) = self.nack_due() {
            deadline = deadline.min(due);
        }
        if let Some(due) = self.fetch_due() {
            deadline = deadline.min(due);
        }
        if let Some(due) = self.pause_due() {
            deadline = deadline.min(due);
        }
        Some(deadline)
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Every event ready, in order, as one queue (what [`Node::poll_event`] would give one
    /// by one); the node queues its next events in `spare`, emptied first (pass a queue
    /// already handed out, so that its memory is used again). For a driver that hands
    /// events to another thread in batches: moving each event out of the node's queue into
    /// a batch of its own cost a 64-byte closed loop at 5 nodes ~8% of the machine (a poll
    /// of 64 packets makes ~16,000 events, 1 MB, so every move missed the caches, and every
    /// new batch was fresh memory for the kernel to fault in).
    pub fn take_events(&mut self, mut spare: VecDeque<Event>) -> VecDeque<Event> {
        spare.clear();
        std::mem::replace(&mut self.events, spare)
    }

    /// The next packet to send.
    pub fn poll_transmit(&mut self, now: Micros) -> Option<Transmit> {
        let transmit = self
            .transmits
            .pop_front()
            .or_else(|| self.data_packet(now))
            .or_else(|| self.ack_packet(now))
            .or_else(|| self.heartbeat_packet(now))?;
        self.last_sent = now;
        self.stats.packets_sent += 1;
        if transmit.destination == Destination::All {
            self.rtt.on_sent(&transmit.contents, now);
        }
        Some(transmit)
    }

    fn header(&self) -> Header {
        Header {
            from: self.id,
            incarnation: self.incarnation,
            view: if self.role.receiver {
                self.view
            } else {
                self.send.known_view
            },
            status: self.status,
            epoch: self.membership.known.epoch as u8,
        }
    }

    fn packet(&self, destination: Destination, body: Body) -> Transmit {
        Transmit {
            destination,
            contents: Packet {
                header: self.header(),
                body,
            }
            .encode(),
        }
    }

    fn queue(&mut self, destination: Destination, body: Body) {
        let transmit = self.packet(destination, body);
        self.transmits.push_back(transmit);
    }

    fn heartbeat_packet(&mut self, now: Micros) -> Option<Transmit> {
        if now < self.last_sent + self.config.heartbeat_interval_us {
            return None;
        }
        if self.role.receiver && self.status == Status::Normal {
            return self.ack_packet_now(false, now);
        }
        Some(self.packet(Destination::All, Body::Heartbeat))
    }

    fn is_member(&self, node: NodeId) -> bool {
        self.members & bit(node) != 0
    }

    fn leader(&self) -> NodeId {
        self.group.leader(self.view)
    }

    fn tick(&mut self, now: Micros) {
        if !self.role.receiver {
            return;
        }
        match self.status {
            Status::Normal => {
                self.detect_failures(now);
            }
            Status::ViewChange => {
                self.take_deferred_start_view(now);
                if self.leader() == self.id && self.status == Status::ViewChange {
                    self.try_start_view(now);
                }
                self.ask_missing_parts(now);
                if self.status == Status::ViewChange && now >= self.change.deadline {
                    self.start_view_change(self.view + 1, now);
                }
            }
            Status::Joining => {
                self.take_deferred_start_view(now);
                if self.status == Status::Joining
                    && now >= self.change.joining_since + 2 * self.config.view_change_timeout_us
                {
                    self.start_view_change(self.view + 1, now);
                }
            }
            Status::Sender => {}
        }
    }

    fn detect_failures(&mut self, now: Micros) -> bool {
        let silent = crate::node::members_of(self.members)
            .into_iter()
            .filter(|&node| node != self.id)
            .find(|node| {
                let heard = self.last_heard.get(node).copied().unwrap_or(0);
                now.saturating_sub(heard) > self.config.suspect_after_us
            });
        if let Some(node) = silent {
            self.events.push_back(Event::Suspected { node });
            self.start_view_change(self.view + 1, now);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_round_trip() {
        assert_eq!(members_of(0b1011), vec![NodeId(0), NodeId(1), NodeId(3)]);
        assert_eq!(bit(NodeId(3)), 8);
    }

    /// `take_events` hands out what `poll_event` would, in order, and the node queues its
    /// next events in the spare given, emptied (its old contents are not events of this
    /// node).
    #[test]
    fn take_events_hands_out_the_queue_and_keeps_the_spare() {
        let group = Group::all_to_all(1);
        let new = || {
            Node::new(
                Config::default(),
                group.clone(),
                NodeId(0),
                0,
                Start::Initial,
                1,
                0,
            )
        };
        let (mut polled, mut taken) = (new(), new());
        let mut one_by_one = Vec::new();
        while let Some(event) = polled.poll_event() {
            one_by_one.push(format!("{event:?}"));
        }
        assert!(!one_by_one.is_empty(), "a new member reports its start");
        let stale = VecDeque::from([Event::Removed, Event::Joined { position: 9 }]);
        let batch = taken.take_events(stale);
        let batch: Vec<String> = batch.iter().map(|event| format!("{event:?}")).collect();
        assert_eq!(batch, one_by_one);
        assert!(taken.poll_event().is_none(), "the spare was emptied");
        assert!(taken.take_events(VecDeque::new()).is_empty());
    }
}
