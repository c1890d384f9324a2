//! The SDK and the chat demo as the server serves them.

use crate::support::*;

#[tokio::test]
async fn the_sdk_and_the_chat_page_are_served_with_safe_headers() {
    let server = start(config()).await;
    let sdk = reqwest::get(server.url("/herald.js")).await.unwrap();
    assert_eq!(sdk.status(), 200);
    assert!(sdk.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/javascript"));
    let body = sdk.text().await.unwrap();
    assert!(body.contains("var Herald ="), "defines the global Herald");

    let chat = reqwest::get(server.url("/chat")).await.unwrap();
    assert_eq!(chat.status(), 200);
    let policy = chat.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(policy.contains("default-src 'self'"), "{policy}");
    assert!(
        !policy.contains("script-src"),
        "scripts only from the server: {policy}"
    );
    let page = chat.text().await.unwrap();
    for needed in ["/herald.js", "/chat.js", "id=\"speak\"", "id=\"nick\""] {
        assert!(page.contains(needed), "{needed}");
    }
    let root = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(server.url("/"))
        .send()
        .await
        .unwrap();
    assert_eq!(root.headers()["location"], "/chat");
    server.stop().await.unwrap();
}

#[tokio::test]
async fn web_false_serves_neither() {
    let mut c = config();
    c.web = false;
    let server = start(c).await;
    for path in ["/herald.js", "/chat", "/chat.js"] {
        let r = reqwest::get(server.url(path)).await.unwrap();
        assert_eq!(r.status(), 404, "{path}");
    }
    server.stop().await.unwrap();
}
