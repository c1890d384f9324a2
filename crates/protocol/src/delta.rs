//! Delta compression of publications: a subscription that asks for it (`delta: "fossil"`)
//! gets, in place of a publication's data, the difference from the previous publication's
//! data on its channel, in Fossil's delta format
//! (<https://fossil-scm.org/home/doc/trunk/www/delta_format.wiki>, the format Centrifugo
//! and Sockudo use, which `fossil-delta` on npm applies). The delta is made once per
//! publication by whoever first needs it and shared by every subscriber that gets it.

/// The name a client asks for the format by.
pub const FOSSIL: &str = "fossil";

/// Whether a subscription asks for deltas: `Ok(false)` for none (an empty name), `Ok(true)`
/// for [`FOSSIL`], and what to tell the client of any other format.
pub fn asked(format: &str) -> Result<bool, String> {
    match format {
        "" => Ok(false),
        FOSSIL => Ok(true),
        other => Err(format!(
            "unknown delta format {other:?}; expected \"fossil\""
        )),
    }
}

/// The Fossil delta that turns `source` into `target`, when it is worth sending: shorter
/// than `target` and text (UTF-8), so that every codec carries it as it is (the JSON codec
/// as a string). `None` when the whole of `target` should go instead.
pub fn fossil(source: &[u8], target: &[u8]) -> Option<Vec<u8>> {
    // The crate's argument order is (target, source).
    let delta = fossil_delta::delta(target, source);
    (delta.len() < target.len() && std::str::from_utf8(&delta).is_ok()).then_some(delta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_change_to_a_document_is_a_small_delta_that_applies() {
        let before = br#"{"price":100,"text":"a fairly long document that stays the same"}"#;
        let after = br#"{"price":101,"text":"a fairly long document that stays the same"}"#;
        let delta = fossil(before, after).expect("worth sending");
        assert!(delta.len() < after.len() / 2, "{}", delta.len());
        assert_eq!(fossil_delta::apply(before, &delta).unwrap(), after);
    }

    #[test]
    fn a_delta_no_shorter_than_the_data_is_not_sent() {
        assert_eq!(fossil(b"{\"a\":1}", b"[2]"), None);
    }

    #[test]
    fn deltas_of_text_with_many_byte_characters_apply_or_are_refused() {
        let before = "{\"t\":\"ééééééééééééééééééééééééééééééé 東京 ééééééééé\"}".as_bytes();
        let after = "{\"t\":\"éééééééééééééééééééééééééééééé京 東京 éééééééééé\"}".as_bytes();
        if let Some(delta) = fossil(before, after) {
            assert!(std::str::from_utf8(&delta).is_ok());
            assert_eq!(fossil_delta::apply(before, &delta).unwrap(), after);
        }
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    proptest! {
        /// Whatever two texts, a delta is made without a panic and gives back the target.
        #[test]
        fn every_delta_applies(source in ".{0,300}", target in ".{0,300}", shared in ".{0,200}") {
            let source = format!("{shared}{source}{shared}");
            let target = format!("{shared}{target}{shared}");
            if let Some(delta) = super::fossil(source.as_bytes(), target.as_bytes()) {
                prop_assert_eq!(fossil_delta::apply(source.as_bytes(), &delta).unwrap(), target.as_bytes());
            }
        }
    }
}
