"""Agent environments for tests/test_agent_*.py: plain openai-SDK agent code, as a user writes it."""

from __future__ import annotations

import asyncio
import json

from aitrain_grpo import AgentEnvironment, AgentResult

CITIES = ["Oslo", "Lima", "Cairo", "Perth", "Quito", "Dakar", "Hanoi", "Minsk"]
TEMPERATURES = {city: 3 + 4 * i for i, city in enumerate(CITIES)}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_temperature",
        "description": "Current temperature in a city, in degrees Celsius.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


class WeatherAgent(AgentEnvironment):
    """A tool loop on the openai SDK: ask, run the tool calls the model makes, ask again, until it answers."""

    max_turns = 4

    def __init__(self, episodes: int = 8):
        self.episodes = episodes

    def build_dataset(self, tokenizer):
        return [{"prompt": f"What is the temperature in {city}?", "city": city, "id": i}
                for i, city in ((i, CITIES[i % len(CITIES)]) for i in range(self.episodes))]

    async def rollout(self, client, row):
        messages = [{"role": "system", "content": f"You answer weather questions. Episode {row['id']}."},
                    {"role": "user", "content": row["prompt"]}]
        looked_up = False
        for _ in range(self.max_turns):
            reply = await self.ask(client, model=client.model, messages=messages, tools=[WEATHER_TOOL], max_tokens=24)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                city = json.loads(call.function.arguments).get("city", "")
                looked_up = looked_up or city == row["city"]
                result = {"city": city, "celsius": TEMPERATURES.get(city)}
                messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
        answer = messages[-1].get("content") or ""
        said = str(TEMPERATURES[row["city"]]) in answer
        return AgentResult(score=0.5 * looked_up + 0.5 * said, metrics={"looked_up": float(looked_up)})

    async def ask(self, client, **request):
        return await client.chat.completions.create(**request)

    def solve(self, episode):
        """The expert: look the city up, then state the number."""
        tool_results = [m for m in episode.messages if m["role"] == "tool"]
        if not tool_results:
            return f'<tool_call>\n{{"name": "get_temperature", "arguments": {{"city": "{episode.row["city"]}"}}}}\n</tool_call>'
        celsius = json.loads(tool_results[-1]["content"])["celsius"]
        return f"It is {celsius} degrees Celsius in {episode.row['city']}."


class StreamingWeatherAgent(WeatherAgent):
    """The same tool loop with streamed replies, accumulated by the openai SDK's own stream helper."""

    async def ask(self, client, **request):
        async with client.chat.completions.stream(**request) as stream:
            async for _ in stream:  # the SDK accumulates the chunks (get_final_completion refuses a cut reply)
                pass
            return stream.current_completion_snapshot


class SummarisingAgent(AgentEnvironment):
    """Rewrites its history between requests (a summary in place of the first exchange): two segments."""

    def build_dataset(self, tokenizer):
        return [{"prompt": "Say something.", "id": i} for i in range(4)]

    async def rollout(self, client, row):
        first = await client.chat.completions.create(
            model=client.model, messages=[{"role": "user", "content": "Say something about hotels."}], max_tokens=12)
        said = first.choices[0].message.content or ""
        summary = [{"role": "user", "content": f"Earlier you said {len(said)} characters. Now say more."}]
        await client.chat.completions.create(model=client.model, messages=summary, max_tokens=12)
        return 0.5


class RaisingAgent(AgentEnvironment):
    def build_dataset(self, tokenizer):
        return [{"prompt": "x"}] * 2

    async def rollout(self, client, row):
        await client.chat.completions.create(model=client.model, messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=4)
        raise KeyError("the agent's own bug")


class LateAgent(AgentEnvironment):
    """Episode 0 leaves its client behind; episode 1 uses it after episode 0 was scored."""

    def __init__(self):
        self.left: dict = {}

    def build_dataset(self, tokenizer):
        return [{"prompt": "x", "id": 0}, {"prompt": "x", "id": 1}]

    async def rollout(self, client, row):
        if row["id"] == 0:
            self.left["client"] = client
            return 1.0
        while "client" not in self.left:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        left = self.left["client"]  # a framework's own client, built from the leaked base URL and key
        late = type(left)(base_url=str(left.base_url), api_key=left.api_key, max_retries=0)
        try:
            await late.chat.completions.create(
                model=client.model, messages=[{"role": "user", "content": "late"}], max_tokens=4)
        except Exception as exc:  # the refusal, recorded for the test
            self.left["refused"] = exc
        try:
            await client.chat.completions.create(model="some-other-model", messages=[{"role": "user", "content": "x"}])
        except Exception as exc:
            self.left["wrong_model"] = exc
        return 0.0


class BlockingAgent(AgentEnvironment):
    """Sync agent code on a blocking client (runs in a worker thread)."""

    def build_dataset(self, tokenizer):
        return [{"prompt": "x", "id": i} for i in range(2)]

    def rollout(self, client, row):
        reply = client.chat.completions.create(model=client.model, messages=[{"role": "user", "content": "Hello"}],
                                               max_tokens=6)
        return 1.0 if reply.choices[0].message.role == "assistant" else 0.0


class ChattyAgent(AgentEnvironment):
    """A simulated user on plain openai code: three requests, each the last plus the reply and a new
    user message (append-only history)."""

    def __init__(self, episodes: int = 4, turns: int = 3, max_tokens: int | None = 10, stop: list | None = None):
        self.episodes, self.turns, self.max_tokens, self.stop = episodes, turns, max_tokens, stop
        self.replies: dict[int, list] = {}

    def build_dataset(self, tokenizer):
        return [{"prompt": f"Tell me about hotels, {i}.", "id": i} for i in range(self.episodes)]

    async def rollout(self, client, row):
        messages = [{"role": "user", "content": row["prompt"]}]
        replies = self.replies.setdefault(row["id"], [])
        for turn in range(self.turns):
            extra = {"stop": self.stop} if self.stop else {}
            reply = await client.chat.completions.create(model=client.model, messages=messages,
                                                         max_tokens=self.max_tokens, **extra)
            replies.append(reply.choices[0])
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            messages.append({"role": "user", "content": f"Go on ({turn})."})
        return 1.0
