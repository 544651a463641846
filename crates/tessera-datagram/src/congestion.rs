//! Congestion control: how many packets a sender may have unacknowledged.
//!
//! The session asks [`CongestionControl::window`] before every transmission and never exceeds
//! the smaller of that and the peer's advertised receive window. The controllers only count
//! packets; they never see bytes, time or the network.

use crate::CongestionKind;
use std::fmt;

/// A congestion controller, told about acknowledgements, restarts and timeouts.
pub trait CongestionControl: fmt::Debug + Send {
    /// Packets the sender may have unacknowledged now; at least 1.
    fn window(&self) -> u32;
    /// `newly_acked` packets were acknowledged for the first time; the receiver can now accept
    /// `receiver_window` packets past the acknowledgement.
    fn on_ack(&mut self, newly_acked: u32, receiver_window: u32);
    /// The receiver reported a gap (a RESTART): one loss, the pipe still flows.
    fn on_restart(&mut self);
    /// The retransmission timer expired: nothing came back for a whole RTO.
    fn on_timeout(&mut self);
    /// The timeouts since the last acknowledgement were spurious (the packets had arrived):
    /// return to the window from before the first of them (RFC 4015's response).
    fn undo_timeout(&mut self);
}

/// Builds the controller a [`CongestionKind`] names, capped at `window_packets_max`.
pub fn controller(kind: CongestionKind, window_packets_max: u32) -> Box<dyn CongestionControl> {
    match kind {
        CongestionKind::Adaptive => Box::new(Adaptive::new(window_packets_max)),
        CongestionKind::Fixed(window) => Box::new(Fixed::new(window.min(window_packets_max))),
    }
}

/// The adaptive window of Swift/RAID (Fullmer, Long and Cabrera, section 4): TCP Reno's slow
/// start and congestion avoidance, but never above the receiver's window (no probing past it),
/// halved on the first RESTART rather than after three duplicate ACKs, and back to one
/// packet on a timeout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adaptive {
    window: u32,
    threshold: u32,
    acked_in_window: u32,
    window_max: u32,
    /// Window and threshold before the first of the timeouts since the last acknowledgement.
    before_timeout: Option<(u32, u32)>,
}

impl Adaptive {
    /// The window a session starts with.
    pub const WINDOW_INITIAL: u32 = 2;
    /// The threshold never drops below this, so that slow start always has room.
    pub const THRESHOLD_MIN: u32 = 2;

    /// A controller whose window never exceeds `window_max` packets.
    pub fn new(window_max: u32) -> Adaptive {
        assert!(window_max >= 1);
        Adaptive {
            window: Self::WINDOW_INITIAL.min(window_max),
            threshold: window_max,
            acked_in_window: 0,
            window_max,
            before_timeout: None,
        }
    }

    /// The slow-start threshold.
    pub fn threshold(&self) -> u32 {
        self.threshold
    }
}

impl CongestionControl for Adaptive {
    fn window(&self) -> u32 {
        self.window
    }

    fn on_ack(&mut self, newly_acked: u32, receiver_window: u32) {
        self.before_timeout = None;
        let before = self.window;
        let mut acked = newly_acked;
        // Slow start: one more packet per packet acknowledged, up to the threshold.
        if self.window < self.threshold {
            let growth = acked.min(self.threshold - self.window);
            self.window += growth;
            acked -= growth;
        }
        // Congestion avoidance: one more packet per window's worth of acknowledgements.
        self.acked_in_window = self.acked_in_window.saturating_add(acked);
        while self.acked_in_window >= self.window {
            self.acked_in_window -= self.window;
            self.window += 1;
        }
        // Growth stops at the receiver's window: the window never grows past what the
        // receiver can take, so it never probes past it. A receiver window that shrinks as
        // the sender uses up a grant is no sign of congestion, though, and does not cut the
        // window: the sender is held to the receiver's window when it sends anyway. (Cutting
        // it sent every answer of a receiver-driven client back to slow start.)
        let cap = self.window_max.min(receiver_window.max(before)).max(1);
        self.window = self.window.min(cap);
        self.acked_in_window = self.acked_in_window.min(self.window - 1);
        assert!(self.window >= 1 && self.window <= self.window_max);
    }

    fn on_restart(&mut self) {
        self.threshold = (self.window / 2).max(Self::THRESHOLD_MIN);
        self.window = self.threshold.min(self.window_max);
        self.acked_in_window = 0;
    }

    fn on_timeout(&mut self) {
        self.before_timeout
            .get_or_insert((self.window, self.threshold));
        self.threshold = (self.window / 2).max(Self::THRESHOLD_MIN);
        self.window = 1;
        self.acked_in_window = 0;
    }

    fn undo_timeout(&mut self) {
        if let Some((window, threshold)) = self.before_timeout.take() {
            self.window = window;
            self.threshold = threshold;
            self.acked_in_window = 0;
        }
    }
}

/// A window fixed at `n` packets whatever happens; `Fixed(1)` is stop-and-wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fixed {
    window: u32,
}

impl Fixed {
    /// A window of `window` packets.
    pub fn new(window: u32) -> Fixed {
        assert!(window >= 1);
        Fixed { window }
    }
}

impl CongestionControl for Fixed {
    fn window(&self) -> u32 {
        self.window
    }

    fn on_ack(&mut self, _newly_acked: u32, _receiver_window: u32) {}

    fn on_restart(&mut self) {}

    fn on_timeout(&mut self) {}

    fn undo_timeout(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_start_doubles_per_round_trip_from_two_packets() {
        let mut adaptive = Adaptive::new(64);
        assert_eq!(adaptive.window(), 2);
        adaptive.on_ack(2, 1000);
        assert_eq!(adaptive.window(), 4);
        adaptive.on_ack(4, 1000);
        assert_eq!(adaptive.window(), 8);
    }

    #[test]
    fn congestion_avoidance_adds_one_packet_per_window_of_acks() {
        let mut adaptive = Adaptive::new(64);
        adaptive.on_ack(14, 1000);
        assert_eq!(adaptive.window(), 16);
        adaptive.on_restart();
        assert_eq!((adaptive.window(), adaptive.threshold()), (8, 8));
        adaptive.on_ack(7, 1000);
        assert_eq!(adaptive.window(), 8);
        adaptive.on_ack(1, 1000);
        assert_eq!(adaptive.window(), 9);
        adaptive.on_ack(9, 1000);
        assert_eq!(adaptive.window(), 10);
    }

    #[test]
    fn timeout_falls_back_to_one_packet_and_slow_starts_to_half() {
        let mut adaptive = Adaptive::new(64);
        adaptive.on_ack(30, 1000);
        assert_eq!(adaptive.window(), 32);
        adaptive.on_timeout();
        assert_eq!((adaptive.window(), adaptive.threshold()), (1, 16));
        adaptive.on_ack(1, 1000);
        adaptive.on_ack(2, 1000);
        adaptive.on_ack(4, 1000);
        adaptive.on_ack(8, 1000);
        assert_eq!(adaptive.window(), 16);
    }

    #[test]
    fn window_never_exceeds_the_receiver_window_nor_the_maximum() {
        let mut adaptive = Adaptive::new(64);
        for _ in 0..100 {
            adaptive.on_ack(10, 5);
            assert!(adaptive.window() <= 5);
        }
        for _ in 0..100 {
            adaptive.on_ack(10, 1000);
            assert!(adaptive.window() <= 64);
        }
        assert_eq!(adaptive.window(), 64);
        // A receiver window that closes stops growth but is no congestion signal.
        adaptive.on_ack(1, 0);
        assert_eq!(adaptive.window(), 64);
    }

    #[test]
    fn a_shrinking_receiver_window_does_not_cut_the_window_but_stops_its_growth() {
        let mut adaptive = Adaptive::new(64);
        adaptive.on_ack(14, 1000);
        assert_eq!(adaptive.window(), 16);
        adaptive.on_ack(4, 3);
        assert_eq!(adaptive.window(), 16);
        adaptive.on_ack(4, 16);
        assert_eq!(adaptive.window(), 16);
        adaptive.on_ack(4, 17);
        assert_eq!(adaptive.window(), 17);
    }

    #[test]
    fn fixed_never_moves() {
        let mut fixed = controller(CongestionKind::Fixed(3), 64);
        fixed.on_ack(100, 1000);
        fixed.on_restart();
        fixed.on_timeout();
        assert_eq!(fixed.window(), 3);
        assert_eq!(controller(CongestionKind::Fixed(500), 64).window(), 64);
    }
}
