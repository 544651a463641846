//! View changes: joining the highest view change heard of, DO-VIEW-CHANGE to the new
//! leader, the leader's choice of the new log (I5), START-VIEW, and asking to join.

use super::{
    bit, ChangeState, DeferredStartView, IncomingStartView, Node, StartViewSent, ViewChangeVote,
};
use crate::log::Log;
use crate::packet::{Body, Header, ImagePart, LogImage};
use crate::parts::{parts_within, Assembly};
use crate::{Destination, Event, GroupRecord, Micros, NodeId, Status, REPAIR_PACKETS_MAX};
use rand::Rng;

impl Node {
    /// What another receiver's header tells about views.
    pub(super) fn observe(&mut self, header: &Header, now: Micros) {
        match header.status {
            Status::ViewChange if header.view > self.view => {
                self.start_view_change(header.view, now);
            }
            Status::Normal | Status::Joining if header.view > self.view => {
                // A view we never heard START-VIEW of has begun: ask to join it.
                self.become_joining(header.view, now);
            }
            Status::Normal if header.view == self.view && self.status == Status::ViewChange => {
                // The view started and its START-VIEW did not reach us whole: ask for it
                // (if we are not a member, the leader's answer says so and we ask to join).
                self.change.started = true;
                self.ask_missing_parts(now);
            }
            Status::ViewChange if header.view == self.view => {
                self.change.changing.insert(header.from);
            }
            // Only a receiver of our group is let in (a removed one may still ask).
            Status::Joining
                if self.status == Status::Normal
                    && self.leader() == self.id
                    && self.membership.record.receivers & bit(header.from) != 0 =>
            {
                self.start_view_change(self.view + 1, now);
            }
            _ => {}
        }
    }

    fn become_joining(&mut self, view: u64, now: Micros) {
        self.view = view;
        self.status = Status::Joining;
        self.members = 0;
        self.change = ChangeState {
            joining_since: now,
            ..ChangeState::default()
        };
        self.receive.peers.clear();
        self.receive.pending.clear();
        self.drop_fetch();
    }

    /// Stops the fast path, promises view `view` (I4) and sends our state to its leader.
    pub(super) fn start_view_change(&mut self, view: u64, now: Micros) {
        assert!(view > self.view, "view change to {view} from {}", self.view);
        // The view we change to runs the newest group we know.
        self.set_record(self.membership.known);
        self.view = view;
        self.status = Status::ViewChange;
        self.members = 0;
        self.receive.peers.clear();
        self.drop_fetch();
        let timeout = self.config.view_change_timeout_us;
        self.change = ChangeState {
            deadline: now + timeout + self.rng.gen_range(0..=timeout),
            joining_since: now,
            ..ChangeState::default()
        };
        self.stats.view_changes += 1;
        let log = &self.receive.log;
        // Below the lowest position some member had not delivered, every member delivered
        // (and would take no log from us there): the vote carries the log from there.
        self.change.vote_from = self.receive.floor.clamp(log.start(), log.end());
        if self.leader() == self.id {
            // Our own vote goes nowhere: it keeps every retained position, for voters that
            // fell behind.
            let vote = ViewChangeVote {
                last_normal: self.last_normal,
                delivered: self.receive.delivered,
                log: log.image(log.start()),
            };
            self.change.votes.insert(self.id, vote);
            self.try_start_view(now);
        } else {
            self.send_vote_parts(0, u64::MAX, usize::MAX);
        }
        // Tells everyone at once, so that they join this view change.
        self.queue(Destination::All, Body::Heartbeat);
    }

    /// Our DO-VIEW-CHANGE's parts that hold positions `from..to`, at most `count`, to the
    /// leader. The log does not change while we change view, so a part sent again is the
    /// part sent before.
    fn send_vote_parts(&mut self, from: u64, to: u64, count: usize) {
        let log = &self.receive.log;
        let parts = log.image_parts(
            self.change.vote_from,
            log.end(),
            self.config.repair_bytes_max,
        );
        let leader = self.leader();
        for part in parts_within(parts, from, to, count) {
            let body = Body::DoViewChange {
                last_normal: self.last_normal,
                commit: self.receive.delivered,
                group: self.membership.known,
                part,
            };
            self.stats.view_change_parts_sent += 1;
            self.queue(Destination::Node(leader), body);
        }
    }

    /// Leader: a part of a receiver's DO-VIEW-CHANGE; its vote counts once whole.
    pub(super) fn on_vote_part(
        &mut self,
        header: &Header,
        (last_normal, commit, group): (Option<u64>, u64, GroupRecord),
        part: ImagePart,
        now: Micros,
    ) {
        if group.epoch > self.membership.known.epoch {
            // The voter knows a newer group: the view change starts again with it (a
            // quorum and a leader judged by an older group would not do).
            self.learn_group(group, now);
            return;
        }
        let receiver = self.voters() & bit(header.from) != 0;
        if !receiver
            || header.view != self.view
            || self.status != Status::ViewChange
            || self.leader() != self.id
            || self.change.votes.contains_key(&header.from)
        {
            return;
        }
        let head = (last_normal.unwrap_or(u64::MAX), commit);
        let mut slot = self.change.assembling.remove(&header.from);
        let whole = assemble(&mut slot, head, part, now);
        if let Some(assembly) = slot {
            self.change.assembling.insert(header.from, assembly);
        }
        match whole {
            None => {}
            Some(Err(())) => self.stats.malformed += 1,
            Some(Ok(log)) => {
                let vote = ViewChangeVote {
                    last_normal,
                    delivered: commit,
                    log,
                };
                self.change.votes.insert(header.from, vote);
                self.try_start_view(now);
            }
        }
    }

    /// A part of a START-VIEW; the view is adopted once the log is whole.
    pub(super) fn on_start_view_part(
        &mut self,
        header: &Header,
        (members, commit, group): (u64, u64, GroupRecord),
        part: ImagePart,
        now: Micros,
    ) {
        let newer =
            header.view > self.view || (header.view == self.view && self.status != Status::Normal);
        let assembling_later = self
            .incoming_start_view
            .as_ref()
            .is_some_and(|incoming| incoming.view > header.view);
        if !newer || assembling_later || header.from != group.group().leader(header.view) {
            return;
        }
        if members & bit(self.id) == 0 {
            self.check_removed(&group);
            if header.view > self.view || self.status != Status::Joining {
                self.know_group(group);
                self.become_joining(header.view, now);
            }
            return;
        }
        let mut slot = self
            .incoming_start_view
            .take()
            .filter(|incoming| incoming.view == header.view)
            .map(|incoming| incoming.assembly);
        let whole = assemble(&mut slot, (members, commit), part, now);
        self.incoming_start_view = slot.map(|assembly| IncomingStartView {
            view: header.view,
            assembly,
        });
        match whole {
            None => {}
            Some(Err(())) => self.stats.malformed += 1,
            Some(Ok(log)) => self.on_start_view(header, (members, commit, group), &log, now),
        }
    }

    /// A node lacks positions `from..to` of the view-change message we sent it in the
    /// header's view: our DO-VIEW-CHANGE (it leads the view we change to) or our START-VIEW
    /// (we lead it).
    pub(super) fn on_missing(&mut self, header: &Header, from: u64, to: u64) {
        if header.view != self.view {
            return;
        }
        let leading = self.leader() == self.id;
        if self.status == Status::ViewChange && !leading && header.from == self.leader() {
            self.send_vote_parts(from, to, REPAIR_PACKETS_MAX);
            return;
        }
        let Some(sent) = self.start_view_sent.as_ref() else {
            return;
        };
        if !leading || self.status != Status::Normal || sent.view != self.view {
            return;
        }
        let (members, commit, group) = (sent.members, sent.commit, sent.group);
        let log = &self.receive.log;
        let bounds = &sent.bounds;
        let retained = log.start() <= bounds.start && bounds.end <= log.end();
        let parts = if members & bit(header.from) == 0 || !retained {
            // Not a member: that is all it needs to learn (it asks to join).
            vec![bounds.clone()]
        } else {
            let parts = log.image_parts(bounds.start, bounds.end, self.config.repair_bytes_max);
            parts_within(parts, from, to, REPAIR_PACKETS_MAX)
        };
        self.send_start_view(
            Destination::Node(header.from),
            (members, commit, group),
            parts,
        );
    }

    /// Queues START-VIEW to `to`, one packet per part of the chosen log.
    fn send_start_view(
        &mut self,
        to: Destination,
        (members, commit, group): (u64, u64, GroupRecord),
        parts: Vec<ImagePart>,
    ) {
        for part in parts {
            let body = Body::StartView {
                members,
                commit,
                group,
                part,
            };
            self.stats.view_change_parts_sent += 1;
            self.queue(to, body);
        }
    }

    /// While changing view: the leader asks each voter whose DO-VIEW-CHANGE stopped short
    /// (no part for two round trips) or never came, a voter asks the leader for the
    /// START-VIEW parts it lacks once the view started; at most once per two round trips.
    pub(super) fn ask_missing_parts(&mut self, now: Micros) {
        if self.status != Status::ViewChange {
            return;
        }
        let pause = 2 * self.round_trip_us();
        let mut asks: Vec<(NodeId, (u64, u64))> = Vec::new();
        if self.leader() == self.id {
            for node in super::members_of(self.voters()) {
                if node == self.id || self.change.votes.contains_key(&node) {
                    continue;
                }
                let range = match self.change.assembling.get(&node) {
                    Some(assembly) if now >= assembly.last_part_at + pause => assembly.missing(),
                    Some(_) => None,
                    None => self
                        .change
                        .changing
                        .contains(&node)
                        .then_some((0, u64::MAX)),
                };
                asks.extend(range.map(|range| (node, range)));
            }
        } else {
            let incoming = self
                .incoming_start_view
                .as_ref()
                .filter(|incoming| incoming.view == self.view);
            let range = match incoming {
                Some(incoming) if now >= incoming.assembly.last_part_at + pause => {
                    incoming.assembly.missing()
                }
                Some(_) => None,
                None => self.change.started.then_some((0, u64::MAX)),
            };
            asks.extend(range.map(|range| (self.leader(), range)));
        }
        for (node, (from, to)) in asks {
            if self
                .change
                .asked_at
                .get(&node)
                .is_some_and(|&at| now < at + pause)
            {
                continue;
            }
            self.change.asked_at.insert(node, now);
            self.stats.missing_sent += 1;
            self.queue(Destination::Node(node), Body::Missing { from, to });
        }
    }

    /// Leader: once a majority of receivers holding state voted, and all receivers did or
    /// a while passed since (a heartbeat interval, or half a view-change timeout while a
    /// receiver heard from lately has not voted), starts the view.
    pub(super) fn try_start_view(&mut self, now: Micros) {
        let holding = self
            .change
            .votes
            .iter()
            .filter(|(_, vote)| vote.last_normal.is_some())
            .fold(0, |set, (&node, _)| set | bit(node));
        if !self.quorum(holding) {
            return;
        }
        let quorum_at = *self.change.quorum_at.get_or_insert(now);
        let voters = super::members_of(self.voters());
        let everyone = self.change.votes.len() == voters.len();
        // A receiver heard from lately is alive and its vote on its way: one left out would
        // ask to join at once and start the next view change, and with votes that carry long
        // logs (each a millisecond or more on the wire) it could be left out every time. So
        // the leader waits for the live ones up to half a view-change timeout, and for the
        // silent ones a heartbeat interval.
        let live_missing = voters.into_iter().any(|node| {
            !self.change.votes.contains_key(&node)
                && self
                    .last_heard
                    .get(&node)
                    .is_some_and(|&heard| now.saturating_sub(heard) <= self.config.suspect_after_us)
        });
        let wait = if live_missing {
            self.config.view_change_timeout_us / 2
        } else {
            self.config.heartbeat_interval_us
        };
        if !everyone && now < quorum_at + wait {
            return;
        }
        let (log, commit) = self.choose_log();
        // Voters of the previous group only (being removed) vouch for the log, but are not
        // members.
        let group = self.membership.record;
        let members = self
            .change
            .votes
            .keys()
            .fold(0, |set, &node| set | bit(node))
            & group.receivers;
        if self.lease_entry_wait(members, now).is_some() {
            return; // The tick tries again.
        }
        let chosen = Log::from_image(&log).expect("chosen from whole, checked votes");
        let parts = chosen.image_parts(log.start, log.end(), self.config.repair_bytes_max);
        let bounds = ImagePart {
            entries: Vec::new(),
            ..parts[0].clone()
        };
        self.send_start_view(Destination::All, (members, commit, group), parts);
        self.adopt_view(self.view, (members, commit, group), &log, now);
        self.start_view_sent = Some(StartViewSent {
            view: self.view,
            members,
            commit,
            group,
            bounds,
        });
    }

    /// The log of the vote with the highest last normal view (the longest among those),
    /// extended downward from other votes to the lowest position some voter has not yet
    /// delivered; and the highest position delivered by a voter.
    fn choose_log(&self) -> (LogImage, u64) {
        let holders: Vec<&ViewChangeVote> = self
            .change
            .votes
            .values()
            .filter(|vote| vote.last_normal.is_some())
            .collect();
        let best = holders
            .iter()
            .max_by_key(|vote| (vote.last_normal, vote.log.end()))
            .expect("a majority voted");
        let commit = holders
            .iter()
            .map(|vote| vote.delivered)
            .max()
            .expect("voters");
        let floor = holders
            .iter()
            .map(|vote| vote.delivered)
            .min()
            .expect("voters");
        let mut image = best.log.clone();
        // Only a voter that delivered every position below the chosen log's start vouches for
        // them: another's log there may hold an older view's undelivered, replaced suffix.
        let base = holders
            .iter()
            .filter(|vote| vote.log.start < image.start && vote.delivered >= image.start)
            .min_by_key(|vote| vote.log.start);
        if let (true, Some(base)) = (floor < image.start, base) {
            let base_log = Log::from_image(&base.log).expect("our own votes are FIFO");
            assert_eq!(
                base_log.hash_at(image.start),
                Some(image.start_hash),
                "the delivered prefixes of two voters differ"
            );
            let mut lower = base_log.image(floor.max(base.log.start));
            lower.entries.truncate((image.start - lower.start) as usize);
            lower.entries.append(&mut image.entries);
            image = lower;
        }
        assert!(
            commit <= image.end(),
            "a delivered position is missing from the new log (I5)"
        );
        if image.start < floor {
            // Every voter delivered the positions below `floor`: nobody needs them sent.
            image = Log::from_image(&image)
                .expect("our own votes are FIFO")
                .image(floor);
        }
        (image, commit)
    }

    pub(super) fn on_start_view(
        &mut self,
        header: &Header,
        (members, commit, group): (u64, u64, GroupRecord),
        log: &LogImage,
        now: Micros,
    ) {
        let newer =
            header.view > self.view || (header.view == self.view && self.status != Status::Normal);
        if !newer || header.from != group.group().leader(header.view) {
            return;
        }
        let member = members & bit(self.id) != 0;
        if member && self.lease_entry_wait(members, now).is_some() {
            self.deferred_start_view = Some(DeferredStartView {
                header: *header,
                members,
                commit,
                group,
                log: log.clone(),
            });
            return;
        }
        self.deferred_start_view = None;
        self.adopt_view(header.view, (members, commit, group), log, now);
    }

    /// A START-VIEW deferred for read leases, entered once its time came (if it is still
    /// the newest: `on_start_view` checks).
    pub(super) fn take_deferred_start_view(&mut self, now: Micros) {
        let due = self
            .deferred_start_view
            .as_ref()
            .is_some_and(|deferred| self.lease_entry_wait(deferred.members, now).is_none());
        if let Some(deferred) = due.then(|| self.deferred_start_view.take()).flatten() {
            let DeferredStartView {
                header,
                members,
                commit,
                group,
                log,
            } = deferred;
            self.on_start_view(&header, (members, commit, group), &log, now);
        }
    }

    /// Enters `view` with its log and group, if a member; otherwise asks to join it.
    fn adopt_view(
        &mut self,
        view: u64,
        (members, commit, group): (u64, u64, GroupRecord),
        image: &LogImage,
        now: Micros,
    ) {
        let Some(log) = Log::from_image(image).filter(|log| commit <= log.end()) else {
            self.stats.malformed += 1;
            return;
        };
        // A START-VIEW of a later view may come while we fetch below this one's log (we
        // missed the view change): that fetch no longer applies.
        self.drop_fetch();
        if members & bit(self.id) == 0 || group.receivers & bit(self.id) == 0 {
            self.check_removed(&group);
            self.know_group(group);
            self.become_joining(view, now);
            return;
        }
        if self.last_normal.is_none() {
            // Joined by state transfer: our deliveries start in the view's epoch.
            self.membership.delivered_epoch = group.epoch;
        }
        self.set_record(group);
        self.receive.view_start = log.start();
        let log = self.keep_own_prefix(log);
        let delivered = self.receive.delivered;
        if let (Some(ours), Some(theirs)) =
            (self.receive.log.hash_at(delivered), log.hash_at(delivered))
        {
            assert_eq!(
                ours, theirs,
                "view {view}'s log contradicts positions {:?} delivered",
                self.id
            );
        }
        // Positions below the view's log that we had not delivered: fetched from a member
        // that retains them, else a gap (the application's state transfer).
        let mut fetch = None;
        if self.last_normal.is_none() {
            self.receive.delivered = commit.max(log.start());
            self.events.push_back(Event::Joined {
                position: self.receive.delivered,
            });
        } else if delivered < log.start() {
            fetch = self
                .fetchable_below(delivered, log.start(), members)
                .map(|hash| (delivered, log.start(), hash));
            if fetch.is_none() {
                self.events.push_back(Event::Gap {
                    from: delivered,
                    to: log.start(),
                });
                self.receive.delivered = log.start();
            }
        }
        if fetch.is_none() {
            self.receive.delivered_counts = log.counts_at(self.receive.delivered);
        }
        self.receive.log = log;
        self.receive.commit = commit.max(self.receive.delivered);
        if self.receive.optimistic_end > self.receive.delivered {
            self.events.push_back(Event::Revoked {
                from: self.receive.delivered,
            });
        }
        self.view = view;
        self.members = members;
        self.incoming_start_view = None;
        self.start_view_sent = None;
        self.enter_normal(now);
        if let Some((start, end, hash)) = fetch {
            self.begin_fetch(start, end, hash, now);
        }
        self.deliver();
    }

    /// The view's log leaves out positions every voter delivered; where ours holds the same
    /// prefix (its hash chain meets the view's log where that starts), we keep our retained
    /// positions below it, for members that fall behind later.
    fn keep_own_prefix(&self, log: Log) -> Log {
        let ours = &self.receive.log;
        let start = log.start();
        if ours.start() >= start || ours.hash_at(start) != log.hash_at(start) {
            return log;
        }
        let mut kept = ours.clone();
        kept.truncate(start);
        for position in start..log.end() {
            let entry = log.get(position).expect("within the log");
            kept.append(entry.id, entry.message.clone());
        }
        kept
    }

    /// Normal status in `self.view` with `self.members`: the fast path resumes.
    pub(super) fn enter_normal(&mut self, now: Micros) {
        self.status = Status::Normal;
        self.last_normal = Some(self.view);
        self.lease_entered_view();
        self.reset_peers(now);
        // While fetching, our log begins past what we delivered.
        let start = self.receive.delivered.max(self.receive.log.start());
        self.receive.optimistic_end = start;
        let end = self.receive.log.end();
        for position in start..end {
            let entry = self.receive.log.get(position).expect("retained");
            self.events.push_back(Event::Optimistic {
                position,
                id: entry.id,
                message: super::membership::application_bytes(&entry.message),
            });
        }
        self.receive.optimistic_end = end;
        self.drain_all_pending(now);
        self.receive.ack_now = true;
        let members: Vec<NodeId> = super::members_of(self.members);
        self.events.push_back(Event::View {
            view: self.view,
            members,
            leader: self.leader(),
        });
    }
}

/// Adds `part` to the message in `slot` (or begins a new one, if it belongs to another);
/// the whole image once every part is in, and the slot emptied.
pub(super) fn assemble(
    slot: &mut Option<Assembly>,
    head: (u64, u64),
    part: ImagePart,
    now: Micros,
) -> Option<Result<LogImage, ()>> {
    match slot {
        Some(assembly) if assembly.matches(head, &part) => assembly.add(part, now),
        _ => *slot = Some(Assembly::new(head, part, now)),
    }
    let whole = slot.as_ref()?.image()?;
    *slot = None;
    Some(whole)
}
