//! Input generation: a corpus entry with stacked mutations, or random bytes.

/// Tokens that reach the corners of Herald's formats: JSON syntax and escapes, numbers past
/// every integer and float limit, RESP type markers, cursor and query separators, bytes
/// that are not UTF-8, line breaks that framings care about.
const DICTIONARY: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b"\\",
    b"\\u",
    b"\\ud800",
    b"\\udc00\\ud800",
    b"1e400",
    b"-1e-400",
    b"-0",
    b"0.0000000000000000000000000001",
    b"18446744073709551615",
    b"18446744073709551616",
    b"-9223372036854775809",
    b"null",
    b"true",
    b"\r",
    b"\n",
    b"\r\n",
    b"\0",
    b"\xff",
    b"\xc0\x80",
    b"\xed\xa0\x80",
    b";",
    b"*",
    b"|",
    b"%",
    b"%00",
    b"%ff",
    b"%3B",
    b"&",
    b"=",
    b":",
    b",",
    b"\"id\":",
    b"\"connect\":{}",
    b"\"subscribe\":",
    b"\"publish\":",
    b"\"history\":",
    b"\"channel\":",
    b"\"data\":",
    b"\"since\":",
    b"\"offset\":",
    b"\"epoch\":",
    b"\"limit\":",
    b"$-1\r\n",
    b"*-1\r\n",
    b"*2\r\n",
    b"*4\r\n",
    b":1\r\n",
    b":-1\r\n",
    b":18446744073709551616\r\n",
    b"+OK\r\n",
    b"-ERR x\r\n",
    b"$5\r\nhello\r\n",
    b"$100000000\r\n",
    b"_\r\n",
    b",1.5\r\n",
    b"%1\r\n",
    b"~1\r\n",
    b"(123\r\n",
    b">2\r\n",
    b"#t\r\n",
    b"channel=",
    b"cursor=",
    b"callback=",
    b"timeout=",
];

/// Longest input made by duplicating ranges; inputs never grow past `max_len` anyway.
const RANDOM_LEN: usize = 256;

/// One generated input of at most `max_len` bytes.
pub fn generate(rng: &mut fastrand::Rng, corpus: &[Vec<u8>], max_len: usize) -> Vec<u8> {
    if corpus.is_empty() || rng.u8(..) < 12 {
        let len = rng.usize(..=RANDOM_LEN.min(max_len));
        return (0..len).map(|_| rng.u8(..)).collect();
    }
    let mut input = corpus[rng.usize(..corpus.len())].clone();
    for _ in 0..rng.usize(1..=8) {
        mutate(rng, &mut input, corpus);
    }
    input.truncate(max_len);
    input
}

fn mutate(rng: &mut fastrand::Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    let at = |rng: &mut fastrand::Rng, input: &Vec<u8>| rng.usize(..=input.len());
    match rng.u8(..8) {
        0 if !input.is_empty() => {
            let i = rng.usize(..input.len());
            input[i] ^= 1 << rng.u8(..8);
        }
        1 if !input.is_empty() => {
            let i = rng.usize(..input.len());
            input[i] = rng.u8(..);
        }
        2 => {
            let i = at(rng, input);
            input.insert(i, rng.u8(..));
        }
        3 if !input.is_empty() => {
            let start = rng.usize(..input.len());
            let end = (start + rng.usize(1..=16)).min(input.len());
            input.drain(start..end);
        }
        4 if !input.is_empty() => {
            // A repeated range: long names, deep nesting, many entries.
            let start = rng.usize(..input.len());
            let end = (start + rng.usize(1..=8)).min(input.len());
            let piece = input[start..end].to_vec();
            let times = if rng.bool() {
                rng.usize(1..4)
            } else {
                rng.usize(1..300)
            };
            let i = at(rng, input);
            let repeated: Vec<u8> = piece
                .iter()
                .copied()
                .cycle()
                .take(piece.len() * times)
                .collect();
            input.splice(i..i, repeated);
        }
        5 | 6 => {
            let token = DICTIONARY[rng.usize(..DICTIONARY.len())];
            let i = at(rng, input);
            if rng.bool() || input.is_empty() {
                input.splice(i..i, token.iter().copied());
            } else {
                let end = (i + token.len()).min(input.len());
                input.splice(i..end, token.iter().copied());
            }
        }
        _ => {
            // Splice: the head of this input, the tail of another.
            let other = &corpus[rng.usize(..corpus.len())];
            let cut = at(rng, input);
            let from = rng.usize(..=other.len());
            input.truncate(cut);
            input.extend_from_slice(&other[from..]);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_seed_replays_the_same_inputs() {
        let corpus = vec![b"{\"id\":1}".to_vec(), b"abc".to_vec()];
        let make = |seed| {
            let mut rng = fastrand::Rng::with_seed(seed);
            (0..100)
                .map(|_| super::generate(&mut rng, &corpus, 1024))
                .collect::<Vec<_>>()
        };
        assert_eq!(make(7), make(7));
        assert_ne!(make(7), make(8));
    }
}
