"""Figure text of chapter 10 (positions in batches), English and Chinese."""

LABELS = {
    "en": {
        "who_key": "key n (tick: its position)",
        "who_query": "query m (tick: its position)",
        "who_distance": "distance m − n",
        "who_layout": "layout",
        "who_layouts": {
            "causal": "causal",
            "padded": "padded",
            "packed": "packed",
            "window": "window",
            "sinks": "sinks",
        },
        "who_titles": {
            "causal": "causal, one sequence",
            "padded": "left-padded: 3 pads",
            "packed": "packed: 5 + 4 + 3",
            "window": "window W = {window}",
            "sinks": "{sinks} sinks + window {window}",
        },
        "explore_who": "Who sees whom among 12 tokens: query rows against key columns, each "
                       "visible pair coloured by its distance m − n, hidden pairs grey, each tick "
                       "the position the token gets; a slider switches between causal, "
                       "left-padded, packed, a sliding window and a window with sinks",
    },
    "zh": {
        "who_key": "键 n（刻度：其位置）",
        "who_query": "查询 m（刻度：其位置）",
        "who_distance": "距离 m − n",
        "who_layout": "布局",
        "who_layouts": {
            "causal": "因果",
            "padded": "左填充",
            "packed": "打包",
            "window": "窗口",
            "sinks": "汇聚点",
        },
        "who_titles": {
            "causal": "因果，单条序列",
            "padded": "左填充：3 个填充词元格",
            "packed": "序列打包：5 + 4 + 3",
            "window": "窗口 W = {window}",
            "sinks": "{sinks} 个注意力汇聚点 + 窗口 {window}",
        },
        "explore_who": "12 个词元之间谁能看见谁：每行是一个查询，每列是一个键，可见的一对按距离 m − n "
                       "着色，看不见的为灰色，刻度为各词元得到的位置；滑块在因果、左填充、序列打包、"
                       "滑动窗口和带注意力汇聚点的窗口之间切换",
    },
}
