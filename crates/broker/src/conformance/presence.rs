//! The presence store's contract as tests (see [`crate::presence`]).

use bytes::Bytes;

use super::ch;

/// Runs every presence check; `make` builds a fresh, empty store.
pub async fn run_presence(make: impl Fn() -> crate::SharedPresence) {
    presence_counts_holders(&make()).await;
    presence_stats_count_clients_and_users(&make()).await;
    presence_pages_list_every_member_once(&make()).await;
}

fn member(id: u64, user: Option<&str>) -> crate::Member {
    crate::Member {
        id,
        info: user.map_or_else(Bytes::new, |u| {
            Bytes::from(format!(r#"{{"user":"{u}","info":{{"n":{id}}}}}"#))
        }),
    }
}

async fn presence_counts_holders(store: &crate::SharedPresence) {
    let c = ch("conformance:presence-holders");
    let m = member(7, Some("ann"));
    let ann = Some("ann");
    assert!(
        store.join(&c, &m, ann).await.unwrap(),
        "a first holder adds the member"
    );
    assert!(
        !store.join(&c, &m, ann).await.unwrap(),
        "a second holder does not"
    );
    assert_eq!(store.stats(&c).await.unwrap().clients, 1);
    assert!(!store.leave(&c, 7).await.unwrap(), "one holder remains");
    assert_eq!(store.stats(&c).await.unwrap().clients, 1);
    assert!(
        store.leave(&c, 7).await.unwrap(),
        "the last holder removes it"
    );
    assert!(
        !store.leave(&c, 7).await.unwrap(),
        "leaving twice is nothing"
    );
    assert_eq!(
        store.stats(&c).await.unwrap(),
        crate::PresenceStats::default()
    );
    assert!(store.members(&c, None, 10).await.unwrap().is_empty());
}

async fn presence_stats_count_clients_and_users(store: &crate::SharedPresence) {
    let c = ch("conformance:presence-stats");
    let other = ch("conformance:presence-stats-other");
    for (id, user) in [
        (1, Some("ann")),
        (2, Some("ann")),
        (3, Some("bob")),
        (4, None),
    ] {
        store.join(&c, &member(id, user), user).await.unwrap();
    }
    store
        .join(&other, &member(1, Some("cy")), Some("cy"))
        .await
        .unwrap();
    let stats = store.stats(&c).await.unwrap();
    assert_eq!(
        (stats.clients, stats.users),
        (4, 2),
        "ann twice, bob, one anonymous"
    );
    store.leave(&c, 1).await.unwrap();
    assert_eq!(
        store.stats(&c).await.unwrap().users,
        2,
        "ann is still here once"
    );
    store.leave(&c, 2).await.unwrap();
    let stats = store.stats(&c).await.unwrap();
    assert_eq!((stats.clients, stats.users), (2, 1));
    assert_eq!(
        store.stats(&other).await.unwrap().clients,
        1,
        "channels are apart"
    );
}

async fn presence_pages_list_every_member_once(store: &crate::SharedPresence) {
    let c = ch("conformance:presence-pages");
    let ids: Vec<u64> = (0..250u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    for (i, id) in ids.iter().enumerate() {
        let user = format!("u{i}");
        let user = (i % 5 != 0).then_some(user.as_str());
        store.join(&c, &member(*id, user), user).await.unwrap();
    }
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = store.members(&c, after, 100).await.unwrap();
        assert!(page.len() <= 100, "a page holds at most its limit");
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        for m in &page {
            let i = ids
                .iter()
                .position(|id| *id == m.id)
                .expect("a member that joined");
            assert_eq!(
                m,
                &member(m.id, (i % 5 != 0).then(|| format!("u{i}")).as_deref())
            );
        }
        seen.extend(page.iter().map(|m| m.id));
    }
    let mut expected = ids.clone();
    expected.sort_unstable();
    assert_eq!(seen, expected, "every member once, in id order");
}
