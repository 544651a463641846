//! View changes: joining the highest view change heard of, DO-VIEW-CHANGE to the new
//! leader, the leader's choice of the new log (I5), START-VIEW, and asking to join.

use super::{bit, ChangeState, Node, ViewChangeVote};
use crate::log::Log;
use crate::packet::{Body, Header, LogImage};
use crate::{Destination, Event, Micros, NodeId, Status};
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
                self.become_joining(header.view, now);
            }
            Status::Joining if self.status == Status::Normal && self.leader() == self.id => {
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
    }

    /// Stops the fast path, promises view `view` (I4) and sends our state to its leader.
    pub(super) fn start_view_change(&mut self, view: u64, now: Micros) {
        assert!(view > self.view, "view change to {view} from {}", self.view);
        self.view = view;
        self.status = Status::ViewChange;
        self.members = 0;
        self.receive.peers.clear();
        let timeout = self.config.view_change_timeout_us;
        self.change = ChangeState {
            deadline: now + timeout + self.rng.gen_range(0..=timeout),
            joining_since: now,
            ..ChangeState::default()
        };
        self.stats.view_changes += 1;
        let vote = ViewChangeVote {
            last_normal: self.last_normal,
            delivered: self.receive.delivered,
            log: self.receive.log.image(self.receive.log.start()),
        };
        let leader = self.leader();
        if leader == self.id {
            self.change.votes.insert(self.id, vote);
            self.try_start_view(now);
        } else {
            let body = Body::DoViewChange {
                last_normal: vote.last_normal,
                commit: vote.delivered,
                log: vote.log,
            };
            self.queue(Destination::Node(leader), body);
        }
        // Tells everyone at once, so that they join this view change.
        self.queue(Destination::All, Body::Heartbeat);
    }

    pub(super) fn on_do_view_change(&mut self, header: &Header, vote: ViewChangeVote, now: Micros) {
        let receiver = self
            .group
            .role(header.from)
            .is_some_and(|role| role.receiver);
        if !receiver
            || header.view != self.view
            || self.status != Status::ViewChange
            || self.leader() != self.id
        {
            return;
        }
        self.change.votes.insert(header.from, vote);
        self.try_start_view(now);
    }

    /// Leader: once a majority of receivers holding state voted, and all receivers did or
    /// a while passed since (a heartbeat interval, or half a view-change timeout while a
    /// receiver heard from lately has not voted), starts the view.
    pub(super) fn try_start_view(&mut self, now: Micros) {
        let holding = self
            .change
            .votes
            .values()
            .filter(|vote| vote.last_normal.is_some())
            .count();
        if holding < self.group.majority() {
            return;
        }
        let quorum_at = *self.change.quorum_at.get_or_insert(now);
        let everyone = self.change.votes.len() == self.group.receivers().len();
        // A receiver heard from lately is alive and its vote on its way: one left out would
        // ask to join at once and start the next view change, and with votes that carry long
        // logs (each a millisecond or more on the wire) it could be left out every time. So
        // the leader waits for the live ones up to half a view-change timeout, and for the
        // silent ones a heartbeat interval.
        let live_missing = self.group.receivers().into_iter().any(|node| {
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
        let members = self
            .change
            .votes
            .keys()
            .fold(0, |set, &node| set | bit(node));
        let body = Body::StartView {
            members,
            commit,
            log: log.clone(),
        };
        self.queue(Destination::All, body);
        self.adopt_view(self.view, members, commit, &log, now);
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
        (image, commit)
    }

    pub(super) fn on_start_view(
        &mut self,
        header: &Header,
        members: u64,
        commit: u64,
        log: &LogImage,
        now: Micros,
    ) {
        let newer =
            header.view > self.view || (header.view == self.view && self.status != Status::Normal);
        if !newer || header.from != self.group.leader(header.view) {
            return;
        }
        self.adopt_view(header.view, members, commit, log, now);
    }

    /// Enters `view` with its log, if a member; otherwise asks to join it.
    fn adopt_view(&mut self, view: u64, members: u64, commit: u64, image: &LogImage, now: Micros) {
        let Some(log) = Log::from_image(image).filter(|log| commit <= log.end()) else {
            self.stats.malformed += 1;
            return;
        };
        if members & bit(self.id) == 0 {
            self.become_joining(view, now);
            return;
        }
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
        if self.last_normal.is_none() {
            self.receive.delivered = commit.max(log.start());
            self.events.push_back(Event::Joined {
                position: self.receive.delivered,
            });
        } else if delivered < log.start() {
            self.events.push_back(Event::Gap {
                from: delivered,
                to: log.start(),
            });
            self.receive.delivered = log.start();
        }
        self.receive.delivered_counts = log.counts_at(self.receive.delivered);
        self.receive.log = log;
        self.receive.commit = commit.max(self.receive.delivered);
        if self.receive.optimistic_end > self.receive.delivered {
            self.events.push_back(Event::Revoked {
                from: self.receive.delivered,
            });
        }
        self.view = view;
        self.members = members;
        self.enter_normal(now);
        self.deliver();
    }

    /// Normal status in `self.view` with `self.members`: the fast path resumes.
    pub(super) fn enter_normal(&mut self, now: Micros) {
        self.status = Status::Normal;
        self.last_normal = Some(self.view);
        self.reset_peers(now);
        self.receive.optimistic_end = self.receive.delivered;
        let end = self.receive.log.end();
        for position in self.receive.delivered..end {
            let entry = self.receive.log.get(position).expect("retained");
            self.events.push_back(Event::Optimistic {
                position,
                id: entry.id,
                message: entry.message.clone(),
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
