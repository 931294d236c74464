//! `Conversation` on Gemma 3 (sliding-window layers): a turn after a
//! rewritten history restores the snapshot taken after the previous prompt
//! and gives the logits a fresh cache gives for the same prefills.

mod common;

use weft::models::chat::{ChatTemplate, Conversation};
use weft::models::sampling::argmax;
use weft::models::LogitRows;

const GEMMA_TEMPLATE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/models/tests/data/chat_templates/gemma2.json"
);

#[test]
fn rewritten_history_rolls_back_to_the_same_logits() {
    let Some(common::Setup { mut exec, model }) = common::load_gemma3(2, None) else {
        return;
    };
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(GEMMA_TEMPLATE).unwrap()).unwrap();
    let template = ChatTemplate::with_tokenizer(
        fixture["source"].as_str().unwrap(),
        "gemma",
        &model.tokenizer,
    )
    .unwrap();
    let policy = model.chunk_policy();
    let mut cache = model
        .new_cache(&mut exec, 1024, policy.max_chunk())
        .unwrap();
    let mut chat = Conversation::new(None);

    let (logits, first) = chat
        .prefill_user(
            &model,
            &mut exec,
            &mut cache,
            &template,
            &policy,
            "Name a colour.",
        )
        .unwrap();
    assert_eq!((first.reused, first.rolled_back), (0, false));
    assert_eq!(first.prefilled, first.prompt_tokens);
    // Four greedy tokens into the cache.
    let mut ids = vec![argmax(&logits) as u32];
    for _ in 0..3 {
        let l = model
            .step(
                &mut exec,
                &mut cache,
                &[*ids.last().unwrap()],
                LogitRows::Last,
            )
            .unwrap();
        ids.push(argmax(&l) as u32);
    }
    assert_eq!(cache.position() as usize, first.prompt_tokens + 3);
    // The history says something else than the ids in the cache.
    chat.finish_answer("Something else entirely.", &ids, &cache);
    let (logits, second) = chat
        .prefill_user(
            &model,
            &mut exec,
            &mut cache,
            &template,
            &policy,
            "Another one.",
        )
        .unwrap();
    assert!(second.rolled_back);
    assert_eq!(second.reused, first.prompt_tokens);
    assert_eq!(second.reused + second.prefilled, second.prompt_tokens);
    assert_eq!(cache.position() as usize, second.prompt_tokens);

    // The same two prefills into a fresh cache: the restored rows are the
    // ones the first prefill wrote, so the logits are the same bits.
    let mut fresh = model
        .new_cache(&mut exec, 1024, policy.max_chunk())
        .unwrap();
    let (head, tail) = chat.cached().split_at(second.reused);
    model
        .prefill(&mut exec, &mut fresh, head, &policy, LogitRows::Last)
        .unwrap();
    let whole = model
        .prefill(&mut exec, &mut fresh, tail, &policy, LogitRows::Last)
        .unwrap();
    assert!(logits == whole, "the logits after the roll-back differ");

    // A third turn extends the second: nothing goes back.
    chat.finish_answer("", &[], &cache);
    let (_, third) = chat
        .prefill_user(&model, &mut exec, &mut cache, &template, &policy, "Thanks.")
        .unwrap();
    assert!(!third.rolled_back);
    assert_eq!(third.reused, second.prompt_tokens);
}
