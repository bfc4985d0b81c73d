"""The built-in demo corpus: agent tool-calling text the tiny model's tokenizer is trained on.

It is generated from small word lists with a fixed seed, so every machine builds the same text,
and the tokenizer (and the build fingerprint, which hashes this text) never drift. The demo task
(`engine.demo.task`) draws its tools and cities from the same lists, so its prompts and gold
answers tokenise into few tokens.
"""

from __future__ import annotations

import hashlib
import json
import random

CITIES = [
    "Paris",
    "London",
    "Tokyo",
    "Berlin",
    "Madrid",
    "Rome",
    "Oslo",
    "Lima",
    "Cairo",
    "Delhi",
    "Seoul",
    "Sydney",
    "Toronto",
    "Boston",
    "Dublin",
    "Vienna",
]

# tool name -> (the phrase users call it by, the single argument it takes)
CITY_TOOLS = {
    "get_weather": "weather",
    "get_time": "time",
    "find_hotels": "hotels",
    "get_news": "news",
}

TOPICS = ["python", "rust", "jazz", "chess", "tea", "bikes", "rockets", "maps", "bees", "poems"]
NAMES = ["ana", "ben", "chen", "dara", "eli", "fay", "gus", "hana"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "INR"]
SKIES = ["sunny", "cloudy", "rainy", "windy", "foggy", "snowy"]
TIMES = ["07:30", "09:00", "12:15", "18:45", "21:00"]

CITY_REQUESTS = [
    "Call the {phrase} tool for {city}.",
    "Use the {phrase} tool for {city}.",
    "What is the {phrase} in {city}?",
    "Please check the {phrase} in {city}.",
    "I need the {phrase} for {city}.",
    "Can you look up the {phrase} in {city}?",
]

SEED = 20240611  # fixed: the corpus must be identical on every machine
CORPUS_LINES = 600


def tool_call(tool: str, **args: object) -> str:
    """A tool call in the one JSON shape the corpus, the task and the rewards all share."""
    return json.dumps({"tool": tool, "args": args})


def _city_exchange(rng: random.Random) -> list[str]:
    tool, phrase = rng.choice(sorted(CITY_TOOLS.items()))
    city = rng.choice(CITIES)
    request = rng.choice(CITY_REQUESTS).format(phrase=phrase, city=city)
    lines = [f"user: {request}", f"assistant: {tool_call(tool, city=city)}"]
    if tool == "get_weather":
        temp, sky = rng.randint(-5, 35), rng.choice(SKIES)
        lines += [
            f"tool: {json.dumps({'temp_c': temp, 'sky': sky})}",
            f"assistant: It is {temp} C and {sky} in {city}.",
        ]
    elif tool == "get_time":
        time = rng.choice(TIMES)
        lines += [f"tool: {json.dumps({'time': time})}", f"assistant: It is {time} in {city}."]
    return lines


def _other_exchange(rng: random.Random) -> list[str]:
    kind = rng.randrange(4)
    if kind == 0:
        topic = rng.choice(TOPICS)
        return [f"user: Search the web for {topic}.", f"assistant: {tool_call('search_web', query=topic)}"]
    if kind == 1:
        name, topic = rng.choice(NAMES), rng.choice(TOPICS)
        return [
            f"user: Email {name} about {topic}.",
            f"assistant: {tool_call('send_email', to=name, subject=topic)}",
        ]
    if kind == 2:
        amount = rng.choice([5, 10, 20, 50, 100])
        src, dst = rng.sample(CURRENCIES, 2)
        return [
            f"user: Convert {amount} {src} to {dst}.",
            f"assistant: {tool_call('convert_currency', amount=amount, source=src, target=dst)}",
        ]
    origin, destination = rng.sample(CITIES, 2)
    return [
        f"user: Book a flight from {origin} to {destination}.",
        f"assistant: {tool_call('book_flight', origin=origin, destination=destination)}",
    ]


def demo_corpus() -> list[str]:
    """About CORPUS_LINES lines of user requests, JSON tool calls, tool results and replies."""
    rng = random.Random(SEED)
    lines: list[str] = []
    while len(lines) < CORPUS_LINES:
        # Mostly the four city tools the demo task trains on, some other tools for variety.
        lines += _city_exchange(rng) if rng.random() < 0.7 else _other_exchange(rng)
    return lines


def corpus_hash() -> str:
    return hashlib.sha256("\n".join(demo_corpus()).encode()).hexdigest()[:16]
