//! Bytes the server holds for one client address beyond its connections' own bounds:
//! replies waiting in a Phoenix long-poll session for a `GET` to take them, the positions
//! a Pusher page left for its next connection. Each is bounded where it is kept (per
//! session, per page); this bounds their sum per address (`limits.held_bytes_per_address`),
//! since one address may open a thousand sessions and pages.

use std::{net::IpAddr, sync::Arc};

use super::{AddressLimits, Limit};

/// Bytes held for one address, counted against its `limits.held_bytes_per_address` while
/// this lives; dropping it gives them back.
#[derive(Debug)]
pub struct HeldBytes {
    limits: Arc<AddressLimits>,
    ip: IpAddr,
    bytes: usize,
}

impl AddressLimits {
    /// An empty account of bytes held for `ip`.
    pub fn hold(self: &Arc<Self>, ip: IpAddr) -> HeldBytes {
        HeldBytes {
            limits: self.clone(),
            ip,
            bytes: 0,
        }
    }
}

impl HeldBytes {
    /// Holds `n` more bytes; false (nothing taken, the refusal counted) when the address
    /// would hold more than its limit.
    pub fn grow(&mut self, n: usize) -> bool {
        let limit = self.limits.config.held_bytes_per_address;
        let taken = self.limits.with_entry(self.ip, |e| {
            if limit > 0 && e.held.saturating_add(n) > limit {
                return false;
            }
            e.held += n;
            true
        });
        if taken {
            self.bytes += n;
        } else {
            let refusals = &self.limits.refusals;
            refusals.count(Limit::HeldBytesPerAddress, Some(self.ip), limit);
        }
        taken
    }

    /// Gives `n` of its bytes back (at most what it holds).
    pub fn shrink(&mut self, n: usize) {
        let n = n.min(self.bytes);
        self.bytes -= n;
        self.limits
            .with_entry(self.ip, |e| e.held = e.held.saturating_sub(n));
    }

    /// The bytes it holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for HeldBytes {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.shrink(self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use crate::config::LimitsConfig;

    use super::*;

    #[test]
    fn an_address_holds_at_most_its_limit_and_gets_it_back_when_dropped() {
        let limits = AddressLimits::new(LimitsConfig {
            held_bytes_per_address: 1000,
            ..Default::default()
        });
        let (a, b) = (
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        );
        let mut first = limits.hold(a);
        let mut second = limits.hold(a);
        assert!(first.grow(600));
        assert!(!second.grow(500), "the address holds 600 of its 1000");
        assert!(second.grow(400));
        assert!(limits.hold(b).grow(1000), "another address has its own");
        first.shrink(100);
        assert!(second.grow(100));
        drop(first);
        assert!(limits.hold(a).grow(500));
        assert_eq!(second.bytes(), 500);
        drop(second);
        limits.sweep();
        assert_eq!(
            limits.tracked(),
            0,
            "nothing is held, every allowance is full"
        );
    }
}
