//! Catching up below a view's log: a member that adopts a view whose log begins past
//! positions it had not delivered asks the view's members for them (FETCH), gets them as
//! parts of one image (LOG-PART, each within `repair_bytes_max`), and delivers them before
//! anything else. Only if no member retains them does it report a gap (a state transfer).
//!
//! Safety: the image is taken only whole, when its hash chain begins at our own hash at the
//! first position we had not delivered and ends at the hash where the view's log begins;
//! so it holds the very messages every member of the view delivered there (I5).

use super::{members_of, Fetch, Node};
use crate::log::Log;
use crate::packet::{Body, Header, ImagePart};
use crate::parts::parts_within;
use crate::{Destination, Event, Micros, NodeId, Status, REPAIR_PACKETS_MAX};

/// Positions fetched at most; a member further behind takes a state transfer.
pub const FETCH_POSITIONS_MAX: u64 = 1 << 20;
/// Questions per other member before we give up and report a gap.
const FETCH_QUESTIONS_PER_MEMBER: u32 = 4;

impl Node {
    /// Our hash at `start`, if positions `start..end` (up to where a view of `members`
    /// begins its log) can be fetched: our log still tells it, another member may hold
    /// them, and they are not too many.
    pub(super) fn fetchable_below(&self, start: u64, end: u64, members: u64) -> Option<u64> {
        let others = members_of(members).into_iter().any(|node| node != self.id);
        let small = end - start <= FETCH_POSITIONS_MAX;
        self.receive.log.hash_at(start).filter(|_| others && small)
    }

    /// A view change or leaving the view ends a fetch: the next view's log decides again
    /// (our log then begins past what we delivered: a gap unless that view's log reaches).
    pub(super) fn drop_fetch(&mut self) {
        self.receive.fetch = None;
    }

    /// Starts fetching `start..end` (our delivered prefix ends at `start`, whose hash is
    /// `start_hash`; the view's log begins at `end`); the first question goes at once.
    pub(super) fn begin_fetch(&mut self, start: u64, end: u64, start_hash: u64, now: Micros) {
        self.receive.fetch = Some(Fetch {
            start,
            end,
            start_hash,
            asked: 0,
            asked_at: now,
            source: None,
            assembly: None,
        });
        self.ask_fetch(now);
    }

    /// When the next question is due (two round trips after the last), if fetching.
    pub(super) fn fetch_due(&self) -> Option<Micros> {
        let fetch = self.receive.fetch.as_ref()?;
        Some(fetch.asked_at + 2 * self.round_trip_us())
    }

    /// Asks a member for the positions still lacking: the one whose parts came since the
    /// last question, else the next in turn; gives up after a few rounds of every member.
    pub(super) fn ask_fetch(&mut self, now: Micros) {
        let others: Vec<NodeId> = members_of(self.members)
            .into_iter()
            .filter(|&node| node != self.id)
            .collect();
        let Some(fetch) = self.receive.fetch.as_mut() else {
            return;
        };
        if others.is_empty() || fetch.asked >= FETCH_QUESTIONS_PER_MEMBER * others.len() as u32 {
            self.give_up_fetch();
            return;
        }
        let target = fetch
            .source
            .take()
            .unwrap_or(others[fetch.asked as usize % others.len()]);
        let (from, to) = fetch
            .assembly
            .as_ref()
            .and_then(|assembly| assembly.missing())
            .unwrap_or((fetch.start, fetch.end));
        fetch.asked += 1;
        fetch.asked_at = now;
        let body = Body::Fetch {
            start: fetch.start,
            end: fetch.end,
            from,
            to,
        };
        self.stats.fetches_sent += 1;
        self.queue(Destination::Node(target), body);
    }

    /// No member answered: the positions are a gap, the application's state transfer.
    fn give_up_fetch(&mut self) {
        let Some(fetch) = self.receive.fetch.take() else {
            return;
        };
        self.events.push_back(Event::Gap {
            from: fetch.start,
            to: fetch.end,
        });
        self.receive.delivered = fetch.end;
        self.receive.delivered_counts = self.receive.log.counts_at(fetch.end);
        self.receive.commit = self.receive.commit.max(fetch.end);
        self.deliver();
    }

    /// A member asks for positions `start..end` of our log, lacking `from..to`: the parts
    /// that hold them, if we retain the range and it lies below our view's log (positions
    /// every member delivered alike).
    pub(super) fn on_fetch(&mut self, header: &Header, image: (u64, u64), lacking: (u64, u64)) {
        let (start, end) = image;
        let log = &self.receive.log;
        let asking = self.status == Status::Normal
            && header.view == self.view
            && header.from != self.id
            && self.is_member(header.from);
        let retained = log.start() <= start && end <= self.receive.view_start.min(log.end());
        if !asking || !retained {
            return;
        }
        let parts = log.image_parts(start, end, self.config.repair_bytes_max);
        for part in parts_within(parts, lacking.0, lacking.1, REPAIR_PACKETS_MAX) {
            self.stats.fetch_parts_sent += 1;
            self.queue(Destination::Node(header.from), Body::LogPart(part));
        }
    }

    /// A part of the image we fetch; once whole and continuing both our delivered prefix
    /// and the view's log, it goes in front of our log and we deliver on.
    pub(super) fn on_log_part(&mut self, header: &Header, part: ImagePart, now: Micros) {
        let view_hash = self.receive.log.hash_at(self.receive.log.start());
        let current = self.status == Status::Normal && header.view == self.view;
        let Some(fetch) = self.receive.fetch.as_mut().filter(|_| current) else {
            return;
        };
        let ours = part.start == fetch.start
            && part.end == fetch.end
            && part.start_hash == fetch.start_hash
            && Some(part.end_hash) == view_hash;
        if !ours {
            return;
        }
        fetch.source = Some(header.from);
        let whole = super::view::assemble(&mut fetch.assembly, (0, 0), part, now);
        let taken = match whole {
            None => return,
            Some(Err(())) => false,
            Some(Ok(image)) => self.take_fetched(&image),
        };
        if !taken {
            self.stats.malformed += 1;
        }
    }

    /// Puts the fetched image in front of our log; `false` if it does not fit (its counts
    /// are not ours at its start, or not the view log's at its end).
    fn take_fetched(&mut self, image: &crate::packet::LogImage) -> bool {
        let Some(mut log) = Log::from_image(image) else {
            return false;
        };
        let ours: Vec<_> = self
            .receive
            .delivered_counts
            .iter()
            .filter(|(_, &count)| count > 0)
            .map(|(&sender, &count)| (sender, count))
            .collect();
        let theirs: Vec<_> = image
            .start_counts
            .iter()
            .copied()
            .filter(|&(_, count)| count > 0)
            .collect();
        let view = &self.receive.log;
        let fits = |counts: std::collections::BTreeMap<crate::SenderId, u64>| {
            counts
                .into_iter()
                .filter(|&(_, count)| count > 0)
                .collect::<Vec<_>>()
        };
        if ours != theirs || fits(log.counts_at(log.end())) != fits(view.counts_at(view.start())) {
            return false;
        }
        for position in view.start()..view.end() {
            let entry = view.get(position).expect("within the log");
            log.append_arrived(entry.id, entry.message.clone(), entry.arrival);
        }
        let fetch = self.receive.fetch.take().expect("fetching");
        self.stats.positions_fetched += fetch.end - fetch.start;
        self.receive.log = log;
        self.deliver();
        true
    }
}
