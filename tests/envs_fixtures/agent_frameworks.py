"""Agent environments written on real agent frameworks, for tests/test_agent_frameworks.py.

Each is the same small weather agent (one function tool, `get_temperature(city)`) in the framework's own
idiom, handed the run's client as the framework expects it: the OpenAI Agents SDK and pydantic-ai take the
`AsyncOpenAI` client itself, LangGraph's `ChatOpenAI` builds its own client from the base URL and key.
Nothing here knows it is being trained. Each `solve` is the expert the text-level tests play: a Hermes
`<tool_call>` first, then the number the tool returned.

The frameworks are imported inside `rollout`, so this module imports without them (the tests skip a
framework that is not installed).
"""

from __future__ import annotations

import json
import re

from aitrain_grpo import AgentEnvironment, AgentResult

CITIES = ["Oslo", "Lima", "Cairo", "Perth", "Quito", "Dakar", "Hanoi", "Minsk"]
TEMPERATURES = {city: 3 + 4 * i for i, city in enumerate(CITIES)}
INSTRUCTIONS = "You answer weather questions. Look the temperature up with get_temperature, then state it."
MAX_TOKENS = 48  # what each agent asks per reply (the run's --rl-max-new-tokens can only lower it)


def states(answer: str, number: int) -> bool:
    """Whether `answer` states `number` (as a whole number, not inside another)."""
    return re.search(rf"(?<!\d){number}(?!\d)", answer or "") is not None


def tool_call_text(city: str) -> str:
    """The expert's first turn: a Hermes tool call."""
    return f"<tool_call>\n{json.dumps({'name': 'get_temperature', 'arguments': {'city': city}})}\n</tool_call>"


def answer_from(tool_result: str, city: str) -> str:
    """The expert's second turn: the number in the tool's result (JSON, a Python repr or plain text)."""
    number = re.search(r"celsius\W*(-?\d+)", tool_result)
    return f"It is {number.group(1) if number else 'unknown'} degrees Celsius in {city}."


class FrameworkWeather(AgentEnvironment):
    """The dataset and the expert every framework's agent shares; `rollout` is the framework's."""

    max_turns = 4
    framework = ""

    def __init__(self, episodes: int = 4):
        self.episodes = episodes

    def build_dataset(self, tokenizer):
        return [{"prompt": f"What is the temperature in {CITIES[i % len(CITIES)]}?", "city": CITIES[i % len(CITIES)],
                 "id": i} for i in range(self.episodes)]

    def result(self, row, answer: str, looked_up: bool) -> AgentResult:
        said = states(answer, TEMPERATURES[row["city"]])
        return AgentResult(score=float(said), metrics={"looked_up": float(looked_up)})

    def solve(self, episode):
        """The expert: look the city up, then state the number the tool gave (whatever shape the
        framework sent the tool's result in: JSON, a Python repr, plain text)."""
        results = [m for m in episode.messages if m["role"] == "tool"]
        if not results:
            return tool_call_text(episode.row["city"])
        return answer_from(results[-1]["content"], episode.row["city"])


class OpenAIAgentsWeather(FrameworkWeather):
    """OpenAI Agents SDK: `Agent` + `@function_tool`, run by `Runner.run` on the chat-completions model."""

    framework = "openai-agents"

    async def rollout(self, client, row):
        from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool)

        looked_up = []

        @function_tool
        def get_temperature(city: str) -> dict:
            """Current temperature in a city, in degrees Celsius."""
            looked_up.append(city)
            return {"city": city, "celsius": TEMPERATURES.get(city)}

        agent = Agent(name="weather", instructions=f"{INSTRUCTIONS} Episode {row['id']}.",
                      model=OpenAIChatCompletionsModel(model=client.model, openai_client=client),
                      model_settings=ModelSettings(max_tokens=MAX_TOKENS), tools=[get_temperature])
        output = await self.run(Runner, agent, row["prompt"], max_turns=self.max_turns + 2,
                                run_config=RunConfig(tracing_disabled=True))
        return self.result(row, str(output or ""), row["city"] in looked_up)

    async def run(self, runner, agent, prompt, **options):
        return (await runner.run(agent, prompt, **options)).final_output


class OpenAIAgentsStreamedWeather(OpenAIAgentsWeather):
    """The same agent run by `Runner.run_streamed`: every chat-completions request has `stream: true`."""

    framework = "openai-agents-streamed"

    async def run(self, runner, agent, prompt, **options):
        result = runner.run_streamed(agent, prompt, **options)
        async for _ in result.stream_events():
            pass
        return result.final_output


class PydanticAIWeather(FrameworkWeather):
    """pydantic-ai: `Agent` on `OpenAIChatModel` over `OpenAIProvider(openai_client=client)`, `@agent.tool_plain`."""

    framework = "pydantic-ai"

    async def rollout(self, client, row):
        from pydantic_ai import Agent
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        looked_up = []
        model = OpenAIChatModel(client.model, provider=OpenAIProvider(openai_client=client))
        agent = Agent(model, instructions=f"{INSTRUCTIONS} Episode {row['id']}.", model_settings={"max_tokens": MAX_TOKENS})

        @agent.tool_plain
        def get_temperature(city: str) -> dict:
            """Current temperature in a city, in degrees Celsius."""
            looked_up.append(city)
            return {"city": city, "celsius": TEMPERATURES.get(city)}

        result = await agent.run(row["prompt"])
        return self.result(row, str(result.output or ""), row["city"] in looked_up)


class LangGraphWeather(FrameworkWeather):
    """LangGraph: the prebuilt ReAct agent on langchain-openai's `ChatOpenAI`, which builds its own client
    from the base URL and API key (the endpoint knows the episode by the key in the URL's path)."""

    framework = "langgraph"

    async def rollout(self, client, row):
        from langchain_core.tools import tool
        from langchain_openai import ChatOpenAI
        from langgraph.prebuilt import create_react_agent

        looked_up = []

        @tool
        def get_temperature(city: str) -> dict:
            """Current temperature in a city, in degrees Celsius."""
            looked_up.append(city)
            return {"city": city, "celsius": TEMPERATURES.get(city)}

        llm = ChatOpenAI(base_url=str(client.base_url), api_key=client.api_key, model=client.model, max_tokens=MAX_TOKENS,
                         max_retries=0)
        graph = create_react_agent(llm, [get_temperature], prompt=f"{INSTRUCTIONS} Episode {row['id']}.")
        state = await graph.ainvoke({"messages": [{"role": "user", "content": row["prompt"]}]},
                                    config={"recursion_limit": 2 * self.max_turns + 2})
        answer = state["messages"][-1].content
        return self.result(row, answer if isinstance(answer, str) else str(answer), row["city"] in looked_up)


FRAMEWORKS = {
    "openai-agents": ("agents", OpenAIAgentsWeather),
    "openai-agents-streamed": ("agents", OpenAIAgentsStreamedWeather),
    "pydantic-ai": ("pydantic_ai", PydanticAIWeather),
    "langgraph": ("langgraph", LangGraphWeather),
}
