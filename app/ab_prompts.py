"""The serving A/B's accuracy prompts (issue 49): fixed, shipped, asked of every arm at temperature 0 before any
pass is measured. Short and varied (facts, code, arithmetic, sequences, formats, languages, reasoning), so a kernel
that changes what the model computes shows on some of them; their answers are compared with arm A's by
app/domain/ab_gate.accuracy, within its stated tolerance."""

PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "def fibonacci(n):",
    "1, 2, 3, 5, 8, 13,",
    "Translate to German: good morning",
    "The chemical symbol for gold is",
    "Water boils at sea level at a temperature of",
    "The largest planet in the solar system is",
    "import numpy as np\nx = np.arange(10)\nprint(x.",
    "SELECT name, age FROM users WHERE",
    "for (int i = 0; i < n; ++i) {",
    "2 + 2 = 4\n3 + 5 = 8\n7 + 6 =",
    "12 * 12 =",
    "The square root of 144 is",
    "Monday, Tuesday, Wednesday,",
    "a, c, e, g,",
    "January, February, March,",
    '{"name": "Alice", "age": 30, "city":',
    "<html>\n<head>\n<title>",
    "| Country | Capital |\n|---|---|\n| Japan |",
    "Translate to French: thank you very much",
    "Translate to Spanish: where is the station?",
    "Der Himmel ist",
    "Il était une fois",
    "Q: If all cats are animals and Tom is a cat, is Tom an animal?\nA:",
    "Q: What is the opposite of hot?\nA:",
    "Photosynthesis converts sunlight, water and carbon dioxide into",
    "The author of Romeo and Juliet is",
    "In 1969, the first humans to walk on the Moon were",
    "Once upon a time, in a small village,",
    "The quick brown fox",
    "To be, or not to be,",
    "Step 1: Preheat the oven to",
)
