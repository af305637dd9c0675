"""Figure text of chapter 9 (positions in today's models), English and Chinese."""

LABELS = {
    "en": {
        "text_tick": "T",  # tick label of a text token
        "image_tick": "img",  # tick label of an image token
        "token": "token",
        "query_patch": "query patch ({r}, {c})",
        "key_column": "key column",
        "key_row": "key row",
        "score": "score",
        "xpos": "xPos (scale_base {gamma})",
        "distance": "distance m - n",
        "score_ones": "score, q = k = ones",
        "model": {
            "rope": "rope",
            "nope": "nope",
            "irope": "irope",
            "rope, chunked": "rope, chunked",
        },
        "eval_length": "evaluation length (bytes); trained on {train_len}",
        "loss_nats": "loss (nats per byte)",
        "mrope_grid": "image (rows × columns of tokens)",
        "mrope_id": "position id",
        "explore_mrope": "The three M-RoPE ids t, h, w of every token of a text-image-text "
                         "sequence; a slider sets the image's grid of tokens after merging.",
    },
    "zh": {
        "text_tick": "文",
        "image_tick": "图",
        "token": "词元",
        "query_patch": "查询图块 ({r}, {c})",
        "key_column": "键图块的列",
        "key_row": "键图块的行",
        "score": "注意力分数",
        "xpos": "xPos（scale_base = {gamma}）",
        "distance": "距离 m - n",
        "score_ones": "分数（q = k = 全 1 向量）",
        "model": {
            "rope": "RoPE",
            "nope": "NoPE",
            "irope": "iRoPE",
            "rope, chunked": "RoPE + 分块注意力",
        },
        "eval_length": "评估长度（字节），训练长度为 {train_len}",
        "loss_nats": "损失（奈特/字节）",
        "mrope_grid": "图像网格（行 × 列）",
        "mrope_id": "位置 id",
        "explore_mrope": "一段“文本—图像—文本”序列中每个词元的三个 M-RoPE 位置 id（t、h、w）；"
                         "滑块设定图像合并后的词元网格。",
    },
}
