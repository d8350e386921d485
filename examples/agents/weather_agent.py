"""A tool-using agent in plain openai-SDK code, trained as it is: an `AgentEnvironment`.

    aitrain env check --rl-env examples.agents.weather_agent:WeatherAgent
    aitrain grpo --model tiny --rl-env examples.agents.weather_agent:WeatherAgent --max-steps 20
    aitrain eval --model outputs/weatheragent --rl-env examples.agents.weather_agent:WeatherAgent

`rollout` is the agent: it asks the model (`client` is an `openai.AsyncOpenAI` on the run's endpoint,
`client.model` the name it serves), runs the tool calls it makes, and asks again until it answers; the
return value is the episode's score. `solve` is the expert `env check` and `aitrain sft` play.
"""

from __future__ import annotations

import json

from aitrain_grpo import AgentEnvironment, AgentResult

FORECAST = {"Oslo": 3, "Lima": 19, "Cairo": 28, "Perth": 24, "Quito": 14, "Hanoi": 31}
TOOLS = [{"type": "function", "function": {
    "name": "get_temperature", "description": "Current temperature in a city, in degrees Celsius.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def get_temperature(city: str) -> dict:
    return {"city": city, "celsius": FORECAST.get(city)}


class WeatherAgent(AgentEnvironment):
    max_turns = 4  # requests per episode; the endpoint answers any past it with finish_reason "length"

    def build_dataset(self, tokenizer):
        return [{"prompt": f"How warm is it in {city}?", "city": city} for city in FORECAST] * 4

    async def rollout(self, client, row):
        messages = [{"role": "system", "content": "Answer with the get_temperature tool."},
                    {"role": "user", "content": row["prompt"]}]
        asked = []
        for _ in range(self.max_turns):
            reply = await client.chat.completions.create(
                model=client.model, messages=messages, tools=TOOLS, max_tokens=128)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                city = json.loads(call.function.arguments or "{}").get("city", "")
                asked.append(city)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(get_temperature(city))})
        last = messages[-1]
        answer = (last.get("content") or "") if last["role"] == "assistant" else ""
        looked_up = row["city"] in asked
        said = str(FORECAST[row["city"]]) in answer
        return AgentResult(score=0.5 * looked_up + 0.5 * said, metrics={"looked_up": float(looked_up)})

    def solve(self, episode):
        """The expert's reply to one request: look the city up, then say the number."""
        results = [json.loads(m["content"]) for m in episode.messages if m["role"] == "tool"]
        if not results:
            call = {"name": "get_temperature", "arguments": {"city": episode.row["city"]}}
            return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        return f"It is {results[-1]['celsius']} degrees Celsius in {results[-1]['city']}."
