//! A key's Redis Cluster slot, as Redis computes it (CRC16/XMODEM of the key's hash tag, or
//! of the whole key without one, modulo 16,384): what may go together in one command.

/// The slot of `key` (or of a shard channel's name).
pub(crate) fn slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) % 16_384
}

/// What is between the first `{` and the first `}` after it, when that is not empty.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let rest = &key[open + 1..];
    let close = rest.iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &rest[..close])
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::slot;

    /// What `CLUSTER KEYSLOT` answers for each (asked of redis-server 7.0).
    #[test]
    fn agrees_with_redis() {
        for (key, expected) in [
            ("123456789", 12739),
            ("foo", 12182),
            ("somekey", 11058),
            ("foo{hash_tag}", 2515),
            ("herald:{chat:room}:p", 14941),
            ("a{}b", 13694),
            ("{}x", 10595),
            ("x{y", 2740),
        ] {
            assert_eq!(slot(key.as_bytes()), expected, "{key}");
        }
    }
}
