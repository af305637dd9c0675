"""Figure text of chapter 8 (long context in practice), English and Chinese."""

LABELS = {
    "en": {
        "method": {  # legends and panel titles, per method name of the chapter
            "none": "none",
            "PI": "PI",
            "NTK": "NTK",
            "dynamic": "dynamic",
            "YaRN": "YaRN",
            "Llama 3": "Llama 3",
            "control": "control",
        },
        "ft_curve": "{method} ({n} B)",
        "ft_step": "fine-tuning step",
        "loss_10": "loss (10-step mean)",
        "input_length": "input length",
        "needle_depth": "needle depth",
        "digits_right": "key digits right",
    },
    "zh": {
        "method": {
            "none": "不缩放",
            "PI": "PI",
            "NTK": "NTK",
            "dynamic": "动态 NTK",
            "YaRN": "YaRN",
            "Llama 3": "Llama 3",
            "control": "对照组",
        },
        "ft_curve": "{method}（{n} 字节）",
        "ft_step": "微调步数",
        "loss_10": "损失（10 步滑动平均）",
        "input_length": "输入长度",
        "needle_depth": "针的深度",
        "digits_right": "密钥数字正确率",
    },
}
